package cloudevents

import (
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
)

// FromPubSub rewrites a message published through the Pub/Sub API in the
// CloudEvents Google Pub/Sub protocol binding into the NATS binding this
// package reads and writes, so every binding sees one event:
//   - binary mode (a ce-specversion attribute): each ce-* attribute, and
//     content-type, becomes a percent-encoded ce-* (content-type) header;
//   - structured mode (a content-type attribute of
//     application/cloudevents+json): content-type becomes a header, as
//     Encode writes it.
//
// Other messages are left as they are. Delivery turns the headers back
// into plain attributes (adapter.Message.PubSubAttributes). m's maps are
// not written; changed ones are replaced.
func FromPubSub(m *adapter.Message) {
	_, binary := m.Attributes[headerPrefix+"specversion"]
	ct, hasCT := m.Attributes[headerContentType]
	structured := hasCT && strings.HasPrefix(ct, "application/cloudevents")
	if !binary && !structured {
		return
	}
	attrs := make(map[string]string, len(m.Attributes))
	h := nats.Header{}
	for name, vals := range m.Header {
		h[name] = vals
	}
	for k, v := range m.Attributes {
		switch {
		case binary && (strings.HasPrefix(k, headerPrefix) || k == headerContentType):
			h[k] = []string{percentEncode(v)}
		case k == headerContentType: // structured: as Encode writes it
			h[k] = []string{v}
		default:
			attrs[k] = v
		}
	}
	if len(attrs) == 0 {
		attrs = nil
	}
	m.Attributes, m.Header = attrs, h
}
