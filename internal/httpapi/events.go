package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/keyrouter"
)

type eventResponse struct {
	MessageID string `json:"messageId"`
}

// events serves the /events routes: POST publishes one CloudEvent, read in
// binary or structured HTTP mode, or a batch of them (batched mode), each
// as a binary-mode NATS message with its partitionkey as ordering key;
// OPTIONS is the webhook validation handshake (webhookValidation).
func (a *api) events(w http.ResponseWriter, r *http.Request, project string) {
	if r.Method == http.MethodOptions {
		a.webhookValidation(w, r, project)
		return
	}
	if !a.allow(w, r, http.MethodPost, http.MethodOptions) {
		return
	}
	topic := r.PathValue("topic")
	if err := validateNames(project, topic); err != nil {
		a.fail(w, r, err)
		return
	}
	if !a.mayPublish(w, r, project, topic) {
		return
	}
	if mediaType(r.Header.Get("Content-Type")) == event.ApplicationCloudEventsBatchJSON {
		a.publishBatch(w, r, project, topic)
		return
	}
	hm, err := newHTTPMessage(r.Header) // before the body: 415 needs no body
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if hm.body, err = a.readBody(w, r); err != nil {
		a.fail(w, r, err)
		return
	}
	e, err := hm.toEvent()
	if err == nil && hm.format != nil {
		err = checkSurrogates(hm.body) // valid JSON now
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	m, err := eventMessage(e)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ids, err := a.send(r, project, topic, []*adapter.Message{m})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.writeJSON(w, http.StatusOK, eventResponse{MessageID: ids[0]})
}

// publishBatch publishes a batched-mode request: every event is decoded
// and checked, and then stored in one broker Publish, which keeps the
// batch's order per ordering key. One bad event fails the request before
// anything is stored, with an error naming it events[i].
func (a *api) publishBatch(w http.ResponseWriter, r *http.Request, project, topic string) {
	body, err := a.readBody(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	msgs, err := decodeBatch(body)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if len(msgs) == 0 {
		// The JSON batch format allows an empty batch: nothing to store,
		// but a topic that does not exist is still 404, as it would be for
		// a batch of one.
		if err := a.topicExists(r.Context(), project, topic); err != nil {
			a.fail(w, r, err)
			return
		}
		a.writeJSON(w, http.StatusOK, publishResponse{MessageIDs: []string{}})
		return
	}
	// The broker checks every message against the topic's limits before
	// it stores any, but names them messages[i]; checking here first names
	// them as the batch does.
	t, err := a.b.Topic(project, topic)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	for i, m := range msgs {
		if err := t.Validate(m); err != nil {
			a.fail(w, r, errorf(statusOf(err), "events[%d]: %w", i, err))
			return
		}
	}
	ids, err := a.send(r, project, topic, msgs)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.writeJSON(w, http.StatusOK, publishResponse{MessageIDs: ids})
}

// decodeBatch reads a body in the JSON batch format: a JSON array of
// events in the JSON (structured-mode) format, at most
// maxMessagesPerRequest, all of the same specversion (HTTP binding,
// batched mode). Each event is checked as a structured-mode request's
// event is, and becomes the message that would store it.
func decodeBatch(body []byte) ([]*adapter.Message, error) {
	var raws []json.RawMessage
	if err := decodeJSON(body, &raws); err != nil {
		return nil, err
	}
	if raws == nil {
		return nil, errorf(http.StatusBadRequest, "invalid JSON: a batch must be an array of events, not null")
	}
	if n := len(raws); n > maxMessagesPerRequest {
		return nil, errorf(http.StatusBadRequest, "%d events in one batch, at most %d", n, maxMessagesPerRequest)
	}
	msgs := make([]*adapter.Message, len(raws))
	var version string
	for i, raw := range raws {
		e, err := decodeBatchEvent(raw)
		if err == nil && i > 0 && e.SpecVersion() != version {
			err = badRequest(fmt.Errorf("%w: specversion %q is not events[0]'s %q: the events of a batch must have the same specversion",
				cloudevents.ErrInvalidEvent, e.SpecVersion(), version))
		}
		var m *adapter.Message
		if err == nil {
			m, err = eventMessage(e)
		}
		if err != nil {
			return nil, errorf(statusOf(err), "events[%d]: %w", i, err)
		}
		if i == 0 {
			version = e.SpecVersion()
		}
		msgs[i] = m
	}
	return msgs, nil
}

// decodeBatchEvent reads one element of a batch as a structured-mode event.
func decodeBatchEvent(raw json.RawMessage) (*event.Event, error) {
	if raw[0] != '{' { // valid JSON, so not empty and without leading space
		return nil, badRequest(fmt.Errorf("%w: not a JSON object: a batch holds events in the JSON format", cloudevents.ErrInvalidEvent))
	}
	hm := &httpMessage{format: format.JSON, body: raw}
	e, err := hm.toEvent()
	if err != nil {
		return nil, err
	}
	if err := checkSurrogates(raw); err != nil {
		return nil, err
	}
	return e, nil
}

// eventMessage is the NATS message that stores e: binary mode, with its
// partitionkey as ordering key.
func eventMessage(e *event.Event) (*adapter.Message, error) {
	key, err := partitionKey(e)
	if err != nil {
		return nil, err
	}
	m, err := cloudevents.Encode(*e, cloudevents.Binary)
	if err != nil {
		return nil, err
	}
	m.OrderingKey = key
	return m, nil
}

// topicExists returns nil when the topic exists, and an error wrapping
// adapter.ErrTopicNotFound when it does not.
func (a *api) topicExists(ctx context.Context, project, topic string) error {
	c, err := a.b.Client(project)
	if err != nil {
		return err
	}
	ok, err := c.Topic(topic).Exists(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("projects/%s/topics/%s: %w", project, topic, adapter.ErrTopicNotFound)
	}
	return nil
}

// Header fields of the CloudEvents webhook validation handshake ("HTTP 1.1
// Web Hooks for Event Delivery", section 4), spelt as the specification
// spells them: Go's canonical form (Webhook-...) would do for any HTTP
// client, but not for one that compares names as strings.
const (
	hdrRequestOrigin   = "WebHook-Request-Origin"
	hdrRequestRate     = "WebHook-Request-Rate"
	hdrRequestCallback = "WebHook-Request-Callback"
	hdrAllowedOrigin   = "WebHook-Allowed-Origin"
	hdrAllowedRate     = "WebHook-Allowed-Rate"
)

// webhookPolicy is what the webhook validation handshake grants.
type webhookPolicy struct {
	allowAll bool
	origins  []string // lower case; "*.example.com" matches its subdomains
	rate     string   // WebHook-Allowed-Rate: requests per minute, or "*"
}

func newWebhookPolicy(origins []string, rate int) webhookPolicy {
	p := webhookPolicy{allowAll: len(origins) == 0, rate: "*"}
	for _, o := range origins {
		o = strings.ToLower(strings.TrimSpace(o))
		if o == "*" {
			p.allowAll = true
		}
		p.origins = append(p.origins, o)
	}
	if rate > 0 {
		p.rate = strconv.Itoa(rate)
	}
	return p
}

// allowedOrigin is the WebHook-Allowed-Origin answer to origin: "*" when
// every origin is allowed, origin itself when it is in the list; ok is
// false when it is not.
func (p webhookPolicy) allowedOrigin(origin string) (answer string, ok bool) {
	if p.allowAll {
		return "*", true
	}
	lower := strings.ToLower(origin)
	for _, o := range p.origins {
		if lower == o || strings.HasPrefix(o, "*.") && len(lower) > len(o)-1 && strings.HasSuffix(lower, o[1:]) {
			return origin, true
		}
	}
	return "", false
}

// webhookValidation answers OPTIONS on the /events routes. With a
// WebHook-Request-Origin header it is the CloudEvents webhook validation
// request: an allowed origin is answered 200 with WebHook-Allowed-Origin,
// WebHook-Allowed-Rate and Allow; any other answer is a refusal and
// carries neither WebHook-Allowed-* header (403 for an origin not
// allowed, 404 for a topic that does not exist). A
// WebHook-Request-Callback is not called: the answer grants (or refuses)
// at once, which the specification allows, and the sidecar makes no
// outbound requests on a client's say-so. Without WebHook-Request-Origin,
// OPTIONS is not served (405), as the specification asks of a target
// that does not handle it.
func (a *api) webhookValidation(w http.ResponseWriter, r *http.Request, project string) {
	origins := r.Header.Values(hdrRequestOrigin)
	if len(origins) == 0 {
		w.Header().Set("Allow", http.MethodPost)
		a.fail(w, r, errorf(http.StatusMethodNotAllowed, "method OPTIONS is allowed on %s only as the CloudEvents webhook validation request, with a %s header: use POST to publish",
			r.URL.Path, hdrRequestOrigin))
		return
	}
	topic := r.PathValue("topic")
	if err := validateNames(project, topic); err != nil {
		a.fail(w, r, err)
		return
	}
	origin := strings.TrimSpace(origins[0])
	switch {
	case len(origins) > 1:
		a.fail(w, r, errorf(http.StatusBadRequest, "header %s is given %d times", hdrRequestOrigin, len(origins)))
		return
	case origin == "":
		a.fail(w, r, errorf(http.StatusBadRequest, "header %s is empty: it names the sending system, such as eventemitter.example.com", hdrRequestOrigin))
		return
	}
	if rates := r.Header.Values(hdrRequestRate); len(rates) > 0 {
		if n, err := strconv.Atoi(strings.TrimSpace(rates[0])); len(rates) > 1 || err != nil || n < 1 {
			a.fail(w, r, errorf(http.StatusBadRequest, "header %s %q: want one positive integer, requests per minute", hdrRequestRate, strings.Join(rates, ", ")))
			return
		}
	}
	allowed, ok := a.webhook.allowedOrigin(origin)
	if !ok {
		a.fail(w, r, errorf(http.StatusForbidden, "origin %q may not deliver events here: it is not one of the sidecar's webhook allowed origins", origin))
		return
	}
	if err := a.topicExists(r.Context(), project, topic); err != nil {
		a.fail(w, r, err)
		return
	}
	if cb := r.Header.Get(hdrRequestCallback); cb != "" {
		a.log.Debug("webhook validation: granted at once, callback not called", "path", r.URL.Path, "origin", origin, "callback", cb)
	}
	h := w.Header()
	h[hdrAllowedOrigin] = []string{allowed}
	h[hdrAllowedRate] = []string{a.webhook.rate} // MUST with WebHook-Request-Rate, SHOULD without
	h.Set("Allow", http.MethodPost+", "+http.MethodOptions)
	w.WriteHeader(http.StatusOK)
}

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
// Batched mode is read by decodeBatch, one structured-mode httpMessage an
// event.
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
// mode its attributes, percent-decoded (decodeHeaderValue).
func newHTTPMessage(h http.Header) (*httpMessage, error) {
	contentType := h.Get("Content-Type")
	if mt := mediaType(contentType); strings.HasPrefix(mt, format.Prefix) {
		if mt == event.ApplicationCloudEventsJSON {
			return &httpMessage{format: format.JSON}, nil
		}
		return nil, errorf(http.StatusUnsupportedMediaType, "Content-Type %q is not supported: the only structured event format is %s, and %s for a batch",
			contentType, event.ApplicationCloudEventsJSON, event.ApplicationCloudEventsBatchJSON)
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
		v := decodeHeaderValue(vals[0])
		if !utf8.ValidString(v) {
			return nil, errorf(http.StatusBadRequest, "header %s: value is not UTF-8 once percent-decoded", name)
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

// decodeHeaderValue undoes the percent-encoding of a ce-* header value
// (HTTP binding, section 3.1.3.2): one round, upper- or lower-case hex. It
// is lenient where the binding is not, because sdk-go (2.16) sends values
// as they are: a '%' that does not start a two-hex-digit escape is taken
// literally, so `50% "off" today` arrives as sent. A literal '%' followed by
// two hex digits cannot be told from an escape and is decoded; the caller
// refuses a result that is not UTF-8.
func decodeHeaderValue(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if ok1 && ok2 {
				b = append(b, hi<<4|lo)
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
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
