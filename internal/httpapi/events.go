package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/keyrouter"
)

// toEvent reads the message as one event and validates it.
func (m *httpMessage) toEvent() (*event.Event, error) {
	e, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return nil, invalidEvent(err)
	}
	if err := e.Validate(); err != nil {
		return nil, invalidEvent(err)
	}
	return e, nil
}

// invalidEvent is a 400 wrapping cloudevents.ErrInvalidEvent. sdk-go lists
// validation failures one a line, in map order; they are sorted and joined
// into one line.
func invalidEvent(err error) error {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	lines = slices.DeleteFunc(lines, func(s string) bool { return strings.TrimSpace(s) == "" })
	sort.Strings(lines)
	return badRequest(fmt.Errorf("%w: %s", cloudevents.ErrInvalidEvent, strings.Join(lines, "; ")))
}

// partitionKey is the event's ordering key: its partitionkey extension, or
// "" when it has none. A partitionkey that is present must be a valid
// ordering key, so an empty one is refused rather than taken as "no key".
func partitionKey(e *event.Event) (string, error) {
	v, ok := e.Extensions()[cloudevents.ExtPartitionKey]
	if !ok {
		return "", nil
	}
	key, err := types.Format(v)
	if err != nil {
		return "", badRequest(fmt.Errorf("%w: partitionkey: %v", cloudevents.ErrInvalidEvent, err))
	}
	if err := keyrouter.ValidateOrderingKey(key); err != nil {
		return "", badRequest(err)
	}
	return key, nil
}

// httpMessage is an HTTP request read as a CloudEvents message, following
// the CloudEvents HTTP protocol binding: structured mode when the
// Content-Type is application/cloudevents+json, binary mode (ce-* headers,
// the body as data) otherwise; binding.ToEvent turns it into an event.
//
// sdk-go's protocol/http package has such a reader, but importing it adds
// go.uber.org/zap to the module; it also takes ce-* header values without
// the percent-decoding the binding prescribes, and panics on a header
// named just "Ce-".
type httpMessage struct {
	format  format.Format     // structured mode
	version spec.Version      // binary mode
	attrs   map[string]string // binary mode: decoded values by attribute or extension name
	body    []byte            // set by the caller once read
}

var (
	_ binding.MessageReader         = (*httpMessage)(nil)
	_ binding.MessageMetadataReader = (*httpMessage)(nil)
)

const cePrefix = "ce-"

// newHTTPMessage reads the request's headers: its mode, and in binary
// mode its attributes, percent-decoded.
func newHTTPMessage(h http.Header) (*httpMessage, error) {
	contentType := h.Get("Content-Type")
	if mt := mediaType(contentType); strings.HasPrefix(mt, format.Prefix) {
		switch mt {
		case event.ApplicationCloudEventsJSON:
			return &httpMessage{format: format.JSON}, nil
		case event.ApplicationCloudEventsBatchJSON:
			return nil, errorf(http.StatusUnsupportedMediaType, "batched mode (%s) is not supported: send one event per request", mt)
		}
		return nil, errorf(http.StatusUnsupportedMediaType, "Content-Type %q is not supported: the only structured event format is %s", contentType, event.ApplicationCloudEventsJSON)
	}
	attrs := map[string]string{}
	for name, vals := range h {
		lower := strings.ToLower(name)
		if !strings.HasPrefix(lower, cePrefix) || len(vals) == 0 {
			continue
		}
		attr := lower[len(cePrefix):]
		switch {
		case attr == "":
			return nil, errorf(http.StatusBadRequest, "header %q names no CloudEvents attribute", name)
		case attr == "datacontenttype":
			return nil, errorf(http.StatusBadRequest, "header %s: in binary mode the data's content type is the Content-Type header", name)
		case len(vals) > 1:
			return nil, errorf(http.StatusBadRequest, "header %s is given %d times", name, len(vals))
		}
		v, err := keyrouter.DecodeKey(vals[0])
		if err != nil {
			return nil, errorf(http.StatusBadRequest, "header %s: %q is not valid percent-encoding", name, vals[0])
		}
		if !utf8.ValidString(v) {
			return nil, errorf(http.StatusBadRequest, "header %s: value is not UTF-8", name)
		}
		attrs[attr] = v
	}
	sv, ok := attrs["specversion"]
	if !ok {
		return nil, errorf(http.StatusBadRequest, "not a CloudEvent: binary mode needs a ce-specversion header, structured mode Content-Type %s", event.ApplicationCloudEventsJSON)
	}
	version := spec.VS.Version(sv)
	if version == nil {
		return nil, errorf(http.StatusBadRequest, "ce-specversion %q is not supported: use %s or %s", sv, event.CloudEventsVersionV1, event.CloudEventsVersionV03)
	}
	if contentType != "" {
		attrs["datacontenttype"] = contentType
	}
	return &httpMessage{version: version, attrs: attrs}, nil
}

// mediaType is a Content-Type without parameters, in lower case.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

func (m *httpMessage) ReadEncoding() binding.Encoding {
	if m.version != nil {
		return binding.EncodingBinary
	}
	return binding.EncodingStructured
}

func (m *httpMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.body))
}

func (m *httpMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	// specversion first, since it chooses the event context the others go
	// into; then the rest in a fixed order, so errors are reproducible.
	if err := w.SetAttribute(m.version.AttributeFromKind(spec.SpecVersion), m.version.String()); err != nil {
		return err
	}
	names := make([]string, 0, len(m.attrs))
	for name := range m.attrs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		var err error
		if a := m.version.Attribute(name); a != nil {
			if a.Kind() == spec.SpecVersion {
				continue
			}
			err = w.SetAttribute(a, m.attrs[name])
		} else {
			err = w.SetExtension(name, m.attrs[name])
		}
		if err != nil {
			if name == "datacontenttype" {
				return fmt.Errorf("Content-Type: %w", err)
			}
			return fmt.Errorf("%s%s: %w", cePrefix, name, err)
		}
	}
	if len(m.body) > 0 {
		return w.SetData(bytes.NewReader(m.body))
	}
	return nil
}

func (m *httpMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	if m.version == nil {
		return nil, nil
	}
	a := m.version.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if v, ok := m.attrs[a.Name()]; ok {
		return a, v
	}
	return a, nil
}

func (m *httpMessage) GetExtension(name string) any {
	if m.version == nil || m.version.Attribute(name) != nil {
		return nil
	}
	if v, ok := m.attrs[strings.ToLower(name)]; ok {
		return v
	}
	return nil
}
