package push

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jetorder/jetorder/cloudevents"
)

// Message is what a push request carries: a Pub/Sub message as the
// subscription delivers it.
type Message struct {
	Data        []byte
	Attributes  map[string]string
	ID          string
	OrderingKey string
	PublishTime time.Time
	// DeliveryAttempt is sent only when above 0. As in Pub/Sub, the runner
	// sets it only when the subscription has a dead-letter policy.
	DeliveryAttempt int
	// Topic is the full topic name, projects/p/topics/t; the CloudEvents
	// envelope's ce-source is built from it.
	Topic string
}

// Format is the shape of the push request.
type Format int

const (
	// Wrapper is Pub/Sub's default: a JSON body with the message (data in
	// base64), the subscription and, with a dead-letter policy, the
	// delivery attempt.
	Wrapper Format = iota
	// NoWrapper is push_config.no_wrapper with write_metadata false: the
	// body is the data, and nothing else is sent.
	NoWrapper
	// NoWrapperWithMetadata is no_wrapper with write_metadata true: the
	// body is the data, attributes are headers named as the attribute,
	// and the metadata are x-goog-pubsub-* headers.
	NoWrapperWithMetadata
	// CloudEvents is selected by the subscription label
	// jetorder-push-format: cloudevents: a CloudEvents HTTP binary-mode
	// request.
	CloudEvents
)

func (f Format) String() string {
	switch f {
	case Wrapper:
		return "wrapper"
	case NoWrapper:
		return "no_wrapper"
	case NoWrapperWithMetadata:
		return "no_wrapper(write_metadata)"
	case CloudEvents:
		return "cloudevents"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// FormatLabel is the subscription label that selects the CloudEvents
// format; its only value is FormatLabelCloudEvents.
const (
	FormatLabel            = "jetorder-push-format"
	FormatLabelCloudEvents = "cloudevents"
)

// ParseFormat returns the Format for a push config: label is the value
// of the subscription's FormatLabel label ("" when absent), noWrapper and
// writeMetadata come from push_config.no_wrapper. A label with another
// value, or the CloudEvents label together with no_wrapper, is refused
// with an error wrapping ErrInvalidPushConfig.
func ParseFormat(label string, noWrapper, writeMetadata bool) (Format, error) {
	switch label {
	case "":
	case FormatLabelCloudEvents:
		if noWrapper {
			return 0, fmt.Errorf("%w: label %s=%s and push_config.no_wrapper both choose the request format: set one", ErrInvalidPushConfig, FormatLabel, label)
		}
		return CloudEvents, nil
	default:
		return 0, fmt.Errorf("%w: label %s=%q: the only value is %q", ErrInvalidPushConfig, FormatLabel, label, FormatLabelCloudEvents)
	}
	switch {
	case noWrapper && writeMetadata:
		return NoWrapperWithMetadata, nil
	case noWrapper:
		return NoWrapper, nil
	}
	return Wrapper, nil
}

// VersionAttribute is the one push_config.attributes key Pub/Sub knows.
// The values "v1" and "v1beta2" select the v1 push format, which is the
// one NewRequest builds; "v1beta1" selects the format of the retired
// v1beta1 API, which the sidecar does not speak.
const (
	VersionAttribute = "x-goog-version"
	DefaultVersion   = "v1"
)

// CheckPushAttributes validates push_config.attributes: x-goog-version, if
// present, must be v1 or v1beta2. Other keys are kept but change nothing,
// so the caller may warn about them. Errors wrap ErrInvalidPushConfig.
func CheckPushAttributes(attrs map[string]string) error {
	v, ok := attrs[VersionAttribute]
	if !ok || v == "v1" || v == "v1beta2" {
		return nil
	}
	return fmt.Errorf("%w: push_config.attributes %s=%q: supported values are v1 and v1beta2", ErrInvalidPushConfig, VersionAttribute, v)
}

// Metadata headers of NoWrapperWithMetadata.
const (
	HeaderSubscription    = "x-goog-pubsub-subscription-name"
	HeaderMessageID       = "x-goog-pubsub-message-id"
	HeaderPublishTime     = "x-goog-pubsub-publish-time"
	HeaderOrderingKey     = "x-goog-pubsub-ordering-key"
	HeaderDeliveryAttempt = "x-goog-pubsub-delivery-attempt"
)

// CloudEvents envelope values, following Eventarc's Pub/Sub events.
const (
	CloudEventType   = "google.cloud.pubsub.topic.v1.messagePublished"
	cloudEventSource = "//pubsub.googleapis.com/"
)

const userAgent = "jetorder-push/1"

// NewRequest builds the POST to endpoint that delivers m for subscription
// (projects/p/subscriptions/s) in format f. It does not check endpoint
// against an allow-list: Client.Deliver does. Errors wrap
// ErrUnencodable (the message cannot be expressed in f: poison) or come
// from http.NewRequestWithContext (a bad endpoint).
//
// The body is a bytes.Reader, so the request can be sent again
// (GetBody is set).
func NewRequest(ctx context.Context, endpoint string, f Format, subscription string, m Message) (*http.Request, error) {
	var (
		body []byte
		hdr  = http.Header{}
		err  error
	)
	switch f {
	case Wrapper:
		body, err = wrapperBody(subscription, m)
		hdr.Set("Content-Type", "application/json")
	case NoWrapper:
		body = m.Data
	case NoWrapperWithMetadata:
		body = m.Data
		err = metadataHeaders(hdr, subscription, m)
	case CloudEvents:
		body, err = cloudEventsRequest(hdr, subscription, m)
	default:
		err = fmt.Errorf("%w: unknown format %v", ErrUnencodable, f)
	}
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", userAgent)
	return req, nil
}

// wireMessage is PubsubMessage in the push JSON. Pub/Sub writes the id and
// publish time twice, camelCase and snake_case, for old endpoints.
type wireMessage struct {
	Attributes       map[string]string `json:"attributes,omitempty"`
	Data             []byte            `json:"data,omitempty"`
	MessageID        string            `json:"messageId"`
	MessageIDSnake   string            `json:"message_id"`
	OrderingKey      string            `json:"orderingKey,omitempty"`
	PublishTime      string            `json:"publishTime,omitempty"`
	PublishTimeSnake string            `json:"publish_time,omitempty"`
}

type wireRequest struct {
	Message         wireMessage `json:"message"`
	Subscription    string      `json:"subscription"`
	DeliveryAttempt int         `json:"deliveryAttempt,omitempty"`
}

func wrapperBody(subscription string, m Message) ([]byte, error) {
	pt := formatTime(m.PublishTime)
	w := wireRequest{
		Message: wireMessage{
			Attributes:       m.Attributes,
			Data:             m.Data,
			MessageID:        m.ID,
			MessageIDSnake:   m.ID,
			OrderingKey:      m.OrderingKey,
			PublishTime:      pt,
			PublishTimeSnake: pt,
		},
		Subscription:    subscription,
		DeliveryAttempt: max(m.DeliveryAttempt, 0),
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnencodable, err)
	}
	return b, nil
}

// formatTime writes a timestamp as protobuf's JSON mapping does: RFC 3339
// in UTC with 0, 3, 6 or 9 fractional digits. The zero time is "".
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	t = t.UTC()
	layout := "2006-01-02T15:04:05Z07:00"
	switch ns := t.Nanosecond(); {
	case ns == 0:
	case ns%1_000_000 == 0:
		layout = "2006-01-02T15:04:05.000Z07:00"
	case ns%1_000 == 0:
		layout = "2006-01-02T15:04:05.000000Z07:00"
	default:
		layout = "2006-01-02T15:04:05.000000000Z07:00"
	}
	return t.Format(layout)
}

// reservedHeaders are request headers an attribute may not set: they
// frame or route the request, or are set by the transport.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Te": true, "Trailer": true, "Upgrade": true, "Expect": true,
	"Proxy-Connection": true, "Proxy-Authorization": true, "Authorization": true,
	"Cookie": true, "User-Agent": true, "Accept-Encoding": true, "Http2-Settings": true,
}

// setHeader sets an attribute-derived header, refusing names and values
// HTTP cannot carry and names that would change the request's framing.
func setHeader(h http.Header, name, value string) error {
	if !validHeaderName(name) {
		return fmt.Errorf("%w: attribute %q is not a valid HTTP header name", ErrUnencodable, name)
	}
	if !validHeaderValue(value) {
		return fmt.Errorf("%w: attribute %q has a value HTTP headers cannot carry (control characters)", ErrUnencodable, name)
	}
	canon := http.CanonicalHeaderKey(name)
	if reservedHeaders[canon] || strings.HasPrefix(canon, "Proxy-") || strings.HasPrefix(canon, "Sec-") {
		return fmt.Errorf("%w: attribute %q would set the reserved HTTP header %s", ErrUnencodable, name, canon)
	}
	h[canon] = []string{value}
	return nil
}

// metadataHeaders writes NoWrapperWithMetadata's headers: each attribute
// as a header of its own name, then the metadata as x-goog-pubsub-*
// (which win over an attribute of the same name).
func metadataHeaders(h http.Header, subscription string, m Message) error {
	for k, v := range m.Attributes {
		if err := setHeader(h, k, v); err != nil {
			return err
		}
	}
	return pubsubHeaders(h, subscription, m)
}

// pubsubHeaders writes the message's Pub/Sub metadata as x-goog-pubsub-*
// headers.
func pubsubHeaders(h http.Header, subscription string, m Message) error {
	h.Set(HeaderSubscription, subscription)
	h.Set(HeaderMessageID, m.ID)
	if pt := formatTime(m.PublishTime); pt != "" {
		h.Set(HeaderPublishTime, pt)
	}
	if m.OrderingKey != "" {
		if !validHeaderValue(m.OrderingKey) {
			return fmt.Errorf("%w: ordering key has characters HTTP headers cannot carry", ErrUnencodable)
		}
		h.Set(HeaderOrderingKey, m.OrderingKey)
	}
	if m.DeliveryAttempt > 0 {
		h.Set(HeaderDeliveryAttempt, strconv.Itoa(m.DeliveryAttempt))
	}
	return nil
}

// cloudEventsRequest fills the headers of a CloudEvents HTTP binary-mode
// request and returns its body.
//
// A message that is already a CloudEvent in the Pub/Sub protocol binding
// (it has a ce-specversion attribute) is sent as that event: every ce-*
// attribute becomes a ce-* header, its value percent-encoded as the HTTP
// binding (3.1.3.2) requires, the content-type attribute becomes
// Content-Type, the data is the body; other attributes are not part of the
// event and are not sent.
//
// A message that holds a structured-mode event (its content-type
// attribute is application/cloudevents+json, or another
// application/cloudevents+ format) is sent in structured mode: that
// Content-Type, and the data as the body.
//
// Any other message is wrapped in the event Eventarc sends for a Pub/Sub
// message: type google.cloud.pubsub.topic.v1.messagePublished, source
// //pubsub.googleapis.com/<topic>, id the message id, time the publish
// time, and as data the MessagePublishedData JSON, which is the push
// wrapper ({"message": ..., "subscription": ...}).
//
// Every form also carries the message's Pub/Sub metadata as the
// x-goog-pubsub-* headers of NoWrapperWithMetadata (message id,
// ordering key, delivery attempt): the event alone has neither.
func cloudEventsRequest(h http.Header, subscription string, m Message) ([]byte, error) {
	if err := pubsubHeaders(h, subscription, m); err != nil {
		return nil, err
	}
	for k, v := range m.Attributes {
		if strings.EqualFold(k, "content-type") && strings.HasPrefix(strings.ToLower(strings.TrimSpace(v)), "application/cloudevents+") {
			if err := setContentType(h, v); err != nil {
				return nil, err
			}
			return m.Data, nil
		}
	}
	if _, ok := m.Attributes["ce-specversion"]; ok {
		for k, v := range m.Attributes {
			lk := strings.ToLower(k)
			switch {
			case lk == "content-type" || lk == "ce-datacontenttype":
				if h.Get("Content-Type") == "" || lk == "content-type" {
					if err := setContentType(h, v); err != nil {
						return nil, err
					}
				}
			case strings.HasPrefix(lk, "ce-") && len(lk) > len("ce-"):
				if err := setHeader(h, lk, cloudevents.PercentEncode(v)); err != nil {
					return nil, err
				}
			}
		}
		return m.Data, nil
	}
	source := cloudEventSource + m.Topic
	if m.Topic == "" {
		source = cloudEventSource + subscription
	}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", cloudevents.PercentEncode(m.ID))
	h.Set("ce-source", cloudevents.PercentEncode(source))
	h.Set("ce-type", CloudEventType)
	if pt := formatTime(m.PublishTime); pt != "" {
		h.Set("ce-time", pt)
	}
	h.Set("Content-Type", "application/json")
	return wrapperBody(subscription, m)
}

func setContentType(h http.Header, v string) error {
	if !validHeaderValue(v) {
		return fmt.Errorf("%w: content-type attribute %q cannot be an HTTP header", ErrUnencodable, v)
	}
	h.Set("Content-Type", v)
	return nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v can be sent as a header value: no
// control characters other than horizontal tab (RFC 9110 field-value;
// bytes 0x80 and above are allowed as obs-text, which carries UTF-8).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
