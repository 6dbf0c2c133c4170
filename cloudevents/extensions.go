package cloudevents

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/jetorder/jetorder/keyrouter"
)

// Extension names.
const (
	// ExtSequence is the sequence extension: a non-empty string that orders
	// the event among its source's events by string comparison.
	ExtSequence = "sequence"
	// ExtRecordedTime is the recordedtime extension: when the producer
	// created this CloudEvent (RFC 3339), as opposed to time, when the
	// occurrence happened.
	ExtRecordedTime = "recordedtime"
	// ExtPartitionKey is the partitioning extension's key; Publish uses it
	// as the ordering key unless given one.
	ExtPartitionKey = "partitionkey"
)

// recordedTimeLayout is RFC 3339 in UTC with microseconds.
const recordedTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// Sequence returns the event's sequence, if it has one.
func Sequence(e event.Event) (string, bool) {
	v, ok := e.Extensions()[ExtSequence]
	if !ok {
		return "", false
	}
	s, err := types.Format(v)
	return s, err == nil
}

// SetSequence sets the event's sequence; it must not be empty.
func SetSequence(e *event.Event, seq string) error {
	if seq == "" {
		return invalid("sequence must not be empty")
	}
	e.SetExtension(ExtSequence, seq)
	return nil
}

// SetRecordedTime stamps recordedtime: t in UTC, RFC 3339 with microseconds.
// Producers call it once, when they create the event (NewEvent does); the
// string written is then carried unchanged to every consumer.
func SetRecordedTime(e *event.Event, t time.Time) {
	e.SetExtension(ExtRecordedTime, t.UTC().Truncate(time.Microsecond).Format(recordedTimeLayout))
}

// RecordedTime returns recordedtime as a time and as the exact string the
// producer wrote. ok is false when the event has none.
func RecordedTime(e event.Event) (t time.Time, text string, ok bool, err error) {
	v, present := e.Extensions()[ExtRecordedTime]
	if !present {
		return time.Time{}, "", false, nil
	}
	text, err = types.Format(v)
	if err != nil {
		return time.Time{}, "", true, invalid("recordedtime: %v", err)
	}
	t, err = time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return time.Time{}, text, true, invalid("recordedtime %q is not an RFC 3339 timestamp", text)
	}
	return t, text, true, nil
}

// checkExtensions validates the extensions this package knows, and keeps
// recordedtime a string: sdk-go would rewrite a time value in its own
// format, and the producer's text must reach consumers unchanged.
func checkExtensions(e *event.Event) error {
	exts := e.Extensions()
	if v, ok := exts[ExtSequence]; ok {
		s, err := types.Format(v)
		if err != nil || s == "" {
			return invalid("sequence must be a non-empty string")
		}
	}
	if v, ok := exts[ExtRecordedTime]; ok {
		if ts, isTime := v.(types.Timestamp); isTime {
			SetRecordedTime(e, ts.Time) // formatted once, by the producer's side
		}
		if _, _, _, err := RecordedTime(*e); err != nil {
			return err
		}
	}
	return nil
}

// PercentEncode escapes a header value as the CloudEvents HTTP and NATS
// bindings say (HTTP binding 3.1.3.2): space, '"', '%' and every byte
// outside printable ASCII, as %XX with upper-case hex.
func PercentEncode(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if mustEscape(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func mustEscape(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c >= 0x7f }

// encodeContentType writes datacontenttype as the content-type header. A
// media type (RFC 2046) is printable ASCII and goes as it is: content-type
// is no ce- header, and readers take it verbatim, as the HTTP binding does
// and as sdk-go's NATS bindings do (they percent-decode nothing), so an
// escaped space would reach them as "text/plain;%20charset=utf-8". A value
// that is not a plain media type (one holding a '%', a byte outside
// printable ASCII, or leading or trailing space, which a header loses) is
// percent-encoded, so that decodeContentType reads it back exactly.
func encodeContentType(v string) string {
	if v == strings.TrimSpace(v) && !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == '%' || r >= 0x7f }) {
		return v
	}
	return PercentEncode(v)
}

// decodeContentType reads a content-type header: percent-decoded, since
// encodeContentType escapes what is not a plain media type (and earlier
// versions escaped every space), or, when it does not decode, as it is:
// another writer's verbatim value. adapter.Message.PubSubAttributes reads
// it the same way, so Pub/Sub clients and Decode see one content type. A
// value that is not UTF-8 either way is an error.
func decodeContentType(v string) (string, error) {
	if d, err := percentDecode(v); err == nil {
		return d, nil
	}
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("%q is not UTF-8", v)
	}
	return v, nil
}

// mediaType is a content type without its parameters, in lower case:
// media types are case-insensitive.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// percentDecode undoes PercentEncode (keyrouter.DecodeKey decodes the same
// %XX escapes). Bytes that need no escape pass as they are, so values
// written unescaped (as sdk-go's bindings write them) read back unchanged,
// unless they hold a '%' that does not start an escape: that is an error,
// as is a result that is not UTF-8.
func percentDecode(s string) (string, error) {
	v, err := keyrouter.DecodeKey(s)
	if err != nil {
		return "", fmt.Errorf("%q is not valid percent-encoding", s)
	}
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("%q decodes to bytes that are not UTF-8", s)
	}
	return v, nil
}
