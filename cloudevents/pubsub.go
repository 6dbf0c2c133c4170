package cloudevents

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
)

// FromPubSub rewrites a message published through the Pub/Sub API in the
// CloudEvents Google Pub/Sub protocol binding into the NATS binding this
// package reads and writes, so every binding sees one event:
//   - binary mode (a ce-specversion attribute): each ce-* attribute becomes
//     a percent-encoded ce-* header, and content-type the content-type
//     header, as Encode writes them;
//   - structured mode (a content-type attribute of
//     application/cloudevents+json): content-type becomes a header, as it
//     is.
//
// The content-type attribute is matched in any case, as the binding's
// reference to the HTTP header suggests: sdk-go's Pub/Sub binding writes
// Content-Type. An attribute that is not spelt content-type stays an
// attribute, so that Pub/Sub clients get back what they sent; the header
// is written beside it, unless a content-type attribute is there too.
//
// An event without a recordedtime extension is stamped now, as Encode
// stamps events published over HTTP.
//
// Other messages are left as they are. Delivery turns the headers back
// into plain attributes (ToPubSub). m's maps are not written; changed ones
// are replaced.
func FromPubSub(m *adapter.Message) {
	_, binary := m.Attributes[headerPrefix+"specversion"]
	ct, hasCT := contentTypeAttribute(m.Attributes)
	structured := hasCT && strings.HasPrefix(mediaType(ct), "application/cloudevents")
	if !binary && !structured {
		return
	}
	attrs := make(map[string]string, len(m.Attributes))
	h := nats.Header{}
	for name, vals := range m.Header {
		h[name] = vals
	}
	if hasCT {
		if binary {
			ct = encodeContentType(ct)
		} // else as it is: delivery decodes content-type beside a ce-specversion only
		h[headerContentType] = []string{ct}
	}
	for k, v := range m.Attributes {
		switch {
		case k == headerContentType: // now the header
		case binary && strings.HasPrefix(k, headerPrefix):
			h[k] = []string{PercentEncode(v)}
		default: // a Content-Type in another case stays too
			attrs[k] = v
		}
	}
	if len(attrs) == 0 {
		attrs = nil
	}
	m.Attributes, m.Header = attrs, h
	recorded := time.Now().UTC().Truncate(time.Microsecond).Format(recordedTimeLayout)
	if binary {
		if _, ok := h[headerPrefix+ExtRecordedTime]; !ok {
			h[headerPrefix+ExtRecordedTime] = []string{PercentEncode(recorded)}
		}
	} else {
		m.Data = withMember(m.Data, ExtRecordedTime, recorded)
	}
}

// ToPubSub is the data and attributes a Pub/Sub client gets for a
// delivered message: its attributes as adapter.Message.PubSubAttributes
// gives them and its data, except that an event without a sequence
// extension gets its position in the topic as one, as Decode gives it (a
// ce-sequence attribute in binary mode, a sequence member in structured
// mode). m is not written.
func ToPubSub(m *adapter.Message) (data []byte, attrs map[string]string) {
	data, attrs = m.Data, m.PubSubAttributes()
	if m.StreamSequence == 0 {
		return data, attrs
	}
	seq := fmt.Sprintf("%020d", m.StreamSequence)
	if _, binary := attrs[headerPrefix+"specversion"]; binary {
		if _, ok := attrs[headerPrefix+ExtSequence]; !ok {
			attrs = maps.Clone(attrs) // PubSubAttributes may return m.Attributes
			attrs[headerPrefix+ExtSequence] = seq
		}
		return data, attrs
	}
	if ct, ok := contentTypeAttribute(attrs); ok && strings.HasPrefix(mediaType(ct), "application/cloudevents") {
		data = withMember(data, ExtSequence, seq)
	}
	return data, attrs
}

// withMember is the structured event data with the string member name set
// to value unless it has one; data that is not a JSON object is returned
// as it is (the Pub/Sub API takes any data).
func withMember(data []byte, name, value string) []byte {
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil || members == nil {
		return data
	}
	if _, ok := members[name]; ok {
		return data
	}
	members[name], _ = json.Marshal(value)
	out, err := json.Marshal(members)
	if err != nil {
		return data
	}
	return out
}

// contentTypeAttribute is the content-type attribute: the one spelt so, or
// else one spelt in another case (the one first in byte order, should
// there be several).
func contentTypeAttribute(attrs map[string]string) (string, bool) {
	if v, ok := attrs[headerContentType]; ok {
		return v, true
	}
	name := ""
	for k := range attrs {
		if strings.EqualFold(k, headerContentType) && (name == "" || k < name) {
			name = k
		}
	}
	if name == "" {
		return "", false
	}
	return attrs[name], true
}
