package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	ce "github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// The CloudEvents acceptance test: one event sent each way (HTTP binary
// and structured mode; the Google Pub/Sub binding's binary mode, also with
// Content-Type spelt as sdk-go's Pub/Sub binding spells it, and its
// structured mode, through Google's Go client; package cloudevents in both
// modes) is read identically, attribute for attribute, through every
// reader: the Pub/Sub binding through Google's Go client, the NATS binding
// by a plain JetStream consumer of the topic's stream, cloudevents.Receive,
// and the HTTP binding at the endpoint of a push subscription. Writers and
// readers are tables, so another way in or out is one entry.

const fourwayTopic = "ce-fourway"

// fourway is one sidecar and a library client on its NATS server.
type fourway struct {
	env *env           // the library's side: adapter client on the sidecar's NATS
	sc  *itest.Sidecar // the sidecar: gRPC and HTTP APIs
	gc  *pubsub.Client
	pub *pubsub.Publisher
}

// ceWriter sends one event into the topic, one way, and returns the id of
// the message stored.
type ceWriter struct {
	name string
	send func(ctx context.Context, fw *fourway, ev event.Event) (string, error)
}

// ceReader reads the topic one way: start subscribes (before anything is
// sent) and receives into the log, by message id, until the test ends.
type ceReader struct {
	name  string
	start func(t *testing.T, fw *fourway, sub string, log *readLog)
}

// read is one message as a reader saw it.
type read struct {
	e           *event.Event
	err         error
	orderingKey string
}

// readLog collects reads from handlers for assertions on the test
// goroutine.
type readLog struct {
	mu   sync.Mutex
	byID map[string]read
}

func (l *readLog) add(id string, r read) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]read{}
	}
	if _, dup := l.byID[id]; !dup { // a redelivery reads the same
		l.byID[id] = r
	}
}

func (l *readLog) get(id string) (read, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.byID[id]
	return r, ok
}

var ceWriters = []ceWriter{
	{"http-binary", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		h := http.Header{}
		for name, v := range bindingAttributes(ev) {
			h.Set("ce-"+name, ce.PercentEncode(v))
		}
		h.Set("Content-Type", ev.DataContentType())
		return fw.postEvent(ctx, h, ev.Data())
	}},
	{"http-structured", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		body, err := json.Marshal(ev)
		if err != nil {
			return "", err
		}
		return fw.postEvent(ctx, http.Header{"Content-Type": {"application/cloudevents+json; charset=utf-8"}}, body)
	}},
	{"pubsub-binary", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		// The Google Pub/Sub binding: ce-<name> attributes with plain
		// values, datacontenttype in content-type, the data as payload.
		attrs := map[string]string{"content-type": ev.DataContentType()}
		for name, v := range bindingAttributes(ev) {
			attrs["ce-"+name] = v
		}
		return fw.pub.Publish(ctx, &pubsub.Message{Data: ev.Data(), Attributes: attrs, OrderingKey: partitionKeyOf(ev)}).Get(ctx)
	}},
	{"pubsub-binary-sdk-go", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		// As sdk-go's Pub/Sub binding writes it: Content-Type, not the
		// binding's content-type.
		attrs := map[string]string{"Content-Type": ev.DataContentType()}
		for name, v := range bindingAttributes(ev) {
			attrs["ce-"+name] = v
		}
		return fw.pub.Publish(ctx, &pubsub.Message{Data: ev.Data(), Attributes: attrs, OrderingKey: partitionKeyOf(ev)}).Get(ctx)
	}},
	{"pubsub-structured", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		data, err := json.Marshal(ev)
		if err != nil {
			return "", err
		}
		return fw.pub.Publish(ctx, &pubsub.Message{Data: data, OrderingKey: partitionKeyOf(ev),
			Attributes: map[string]string{"content-type": "application/cloudevents+json; charset=UTF-8"}}).Get(ctx)
	}},
	{"cloudevents-binary", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		return ce.Publish(ctx, fw.env.client.Topic(fourwayTopic), ev).Get(ctx)
	}},
	{"cloudevents-structured", func(ctx context.Context, fw *fourway, ev event.Event) (string, error) {
		return ce.Publish(ctx, fw.env.client.Topic(fourwayTopic), ev, ce.WithMode(ce.Structured)).Get(ctx)
	}},
}

var ceReaders = []ceReader{
	{"pubsub", func(t *testing.T, fw *fourway, sub string, log *readLog) {
		mustCreateSub(t, fw.gc, &pb.Subscription{Name: subPath(sub), Topic: topicPath(fourwayTopic), EnableMessageOrdering: true})
		receiveGo(t, fw.gc.Subscriber(sub), func(_ context.Context, m *pubsub.Message) {
			e, err := fromPubSubBinding(m.Attributes, m.Data)
			log.add(m.ID, read{e: e, err: err, orderingKey: m.OrderingKey})
			m.Ack()
		})
	}},
	{"nats-binding", func(t *testing.T, fw *fourway, _ string, log *readLog) {
		// A NATS client that knows nothing of jetorder reads the topic's
		// stream in the CloudEvents NATS binding.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cons, err := jetstreamOf(t, fw.env).OrderedConsumer(ctx, keyrouter.StreamName(project, fourwayTopic), jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			e, err := fromNATSBinding(m.Headers(), m.Data())
			key, _ := keyrouter.DecodeKey(m.Headers().Get("Jetorder-Ordering-Key")) // docs/WIRE.md
			log.add(m.Headers().Get("Nats-Msg-Id"), read{e: e, err: err, orderingKey: key})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Stop)
	}},
	{"push", func(t *testing.T, fw *fourway, sub string, log *readLog) {
		// A push subscription with the label jetorder-push-format:
		// cloudevents: the sidecar POSTs each message to an endpoint beside
		// it as a CloudEvents HTTP request, read here with sdk-go's binding.
		endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m, err := newHTTPBindingMessage(r)
			var e *event.Event
			if err == nil {
				e, err = binding.ToEvent(r.Context(), m)
			}
			// The message around the event comes as Pub/Sub's metadata
			// headers.
			log.add(r.Header.Get(push.HeaderMessageID), read{e: e, err: err, orderingKey: r.Header.Get(push.HeaderOrderingKey)})
			w.WriteHeader(http.StatusNoContent) // an ack
		}))
		t.Cleanup(endpoint.Close)
		mustCreateSub(t, fw.gc, &pb.Subscription{
			Name: subPath(sub), Topic: topicPath(fourwayTopic), EnableMessageOrdering: true,
			Labels:     map[string]string{push.FormatLabel: push.FormatLabelCloudEvents},
			PushConfig: &pb.PushConfig{PushEndpoint: endpoint.URL}, // 127.0.0.1: --push-allow's default allows it
		})
	}},
	{"cloudevents", func(t *testing.T, fw *fourway, sub string, log *readLog) {
		s := fw.env.createSub(sub, adapter.SubscriptionConfig{Topic: fw.env.client.Topic(fourwayTopic), EnableMessageOrdering: true})
		startReceiving(t, func(ctx context.Context) error {
			return ce.Receive(ctx, s, func(_ context.Context, e *event.Event, m *adapter.Message, err error) {
				log.add(m.ID, read{e: e, err: err, orderingKey: m.OrderingKey})
				m.Ack()
			})
		})
	}},
}

// fourwayEvents are the events sent: every context attribute, with text
// that needs escaping in every binding (non-ASCII, space, %, "), an
// extension of each JSON type, the project's sequence and recordedtime,
// and data of three kinds.
func fourwayEvents(t *testing.T) map[string]event.Event {
	t.Helper()
	base := func(name string) event.Event {
		e := event.New()
		e.SetID("évènement " + name + ` 100% "quoted"`)
		e.SetSource(`/sources/émetteur 100%25 "quoted"`)
		e.SetType("com.example.fourway.créé")
		e.SetSubject(`sujet é 100% "quoted" ; x=y %41`) // %41 is no escape in a plain value
		e.SetTime(time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("", 2*3600)))
		e.SetDataSchema("https://example.com/schémas/fourway.json?v=1&x=é")
		e.SetExtension("exstring", `with spaces, é, 100% and "quotes", %41`)
		e.SetExtension("exint", int32(-42))
		e.SetExtension("exbool", true)
		e.SetExtension(ce.ExtSequence, "00000000000000000042")
		e.SetExtension(ce.ExtRecordedTime, "2026-11-21T10:00:00.123+01:00") // the producer's text, not the canonical form
		e.SetExtension(ce.ExtPartitionKey, "client é 42")
		return e
	}
	text := base("text")
	if err := text.SetData("text/plain; charset=utf-8", "binary-ish\x00\x01\t\r\n é 100% \"quoted\" \x7f end"); err != nil {
		t.Fatal(err)
	}
	js := base("json")
	if err := js.SetData("application/json", json.RawMessage(`{"amount":-42,"note":"é 100% \"quoted\"","nested":[1,2.5,{"x":null}],"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	octets := base("octets")
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	if err := octets.SetData("application/octet-stream", all); err != nil {
		t.Fatal(err)
	}
	evs := map[string]event.Event{"text": text, "json": js, "octets": octets}
	for name, e := range evs {
		if err := e.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return evs
}

func TestCloudEventsFourWays(t *testing.T) {
	e := newEnv(t)
	sc := itest.Start(t, sidecar.Config{NATSURL: e.srv.ClientURL()})
	fw := &fourway{env: e, sc: sc, gc: sc.GoClient()}
	mustCreateTopic(t, fw.gc, fourwayTopic)
	fw.pub = fw.gc.Publisher(fourwayTopic)
	fw.pub.EnableMessageOrdering = true
	defer fw.pub.Stop()

	logs := make([]*readLog, len(ceReaders))
	for i, r := range ceReaders {
		logs[i] = &readLog{}
		r.start(t, fw, "fourway-"+r.name, logs[i])
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type sent struct {
		name, id string // name: event/writer
		want     event.Event
	}
	var all []sent
	events := fourwayEvents(t)
	for _, evName := range slices.Sorted(maps.Keys(events)) {
		for _, w := range ceWriters {
			id, err := w.send(ctx, fw, events[evName])
			if err != nil {
				t.Fatalf("%s/%s: send: %v", evName, w.name, err)
			}
			all = append(all, sent{evName + "/" + w.name, id, events[evName]})
		}
	}

	for i, r := range ceReaders {
		unread := func() []string {
			var ids []string
			for _, s := range all {
				if _, ok := logs[i].get(s.id); !ok {
					ids = append(ids, s.name)
				}
			}
			return ids
		}
		testutil.Eventually(t, 30*time.Second, func() bool { return len(unread()) == 0 }, "%s has not read %v", r.name, unread)
	}
	for _, s := range all {
		for i, r := range ceReaders {
			t.Run(s.name+"/"+r.name, func(t *testing.T) {
				got, ok := logs[i].get(s.id)
				if !ok {
					t.Fatalf("message %s not read", s.id)
				}
				if got.err != nil {
					t.Fatalf("not read as a CloudEvent: %v", got.err)
				}
				if key := partitionKeyOf(s.want); got.orderingKey != key {
					t.Errorf("ordering key %q, want the partitionkey %q", got.orderingKey, key)
				}
				for _, d := range eventDiff(s.want, *got.e) {
					t.Error(d)
				}
			})
		}
	}
}

// postEvent POSTs one event to the sidecar's HTTP API and returns the id
// of the message stored.
func (fw *fourway) postEvent(ctx context.Context, h http.Header, body []byte) (string, error) {
	url := "http://" + fw.sc.HTTP + "/v1/projects/" + project + "/topics/" + fourwayTopic + "/events"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var r struct {
		MessageID string `json:"messageId"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.MessageID == "" {
		return "", fmt.Errorf("answer %s: %v", b, err)
	}
	return r.MessageID, nil
}

// bindingAttributes are the event's context attributes and extensions, but
// datacontenttype, by name, as the canonical strings binary-mode bindings
// carry. time keeps its offset: any RFC 3339 form is canonical.
func bindingAttributes(ev event.Event) map[string]string {
	attrs := map[string]string{"specversion": ev.SpecVersion(), "id": ev.ID(), "source": ev.Source(), "type": ev.Type()}
	if v := ev.Subject(); v != "" {
		attrs["subject"] = v
	}
	if v := ev.DataSchema(); v != "" {
		attrs["dataschema"] = v
	}
	if t := ev.Time(); !t.IsZero() {
		attrs["time"] = t.Format(time.RFC3339Nano)
	}
	for name, v := range ev.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			panic(fmt.Sprintf("extension %s: %v", name, err)) // fourwayEvents has none such
		}
		attrs[name] = s
	}
	return attrs
}

func partitionKeyOf(ev event.Event) string {
	s, _ := types.Format(ev.Extensions()[ce.ExtPartitionKey])
	return s
}

// fromPubSubBinding reads a Pub/Sub message as the CloudEvents Google
// Pub/Sub protocol binding says: structured mode when the content-type
// attribute starts with application/cloudevents, binary mode otherwise
// (ce-<name> attributes with plain values, content-type the
// datacontenttype, the data the payload). An attribute that is neither
// ce-* nor content-type (in any case) is an error: the test sends none, so
// one would be something the sidecar leaked.
func fromPubSubBinding(attrs map[string]string, data []byte) (*event.Event, error) {
	if ct := attrs["content-type"]; strings.HasPrefix(ct, "application/cloudevents") {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != event.ApplicationCloudEventsJSON {
			return nil, fmt.Errorf("structured content-type %q is not the JSON format", ct)
		}
		for k := range attrs {
			if !strings.EqualFold(k, "content-type") {
				return nil, fmt.Errorf("structured mode with attributes %v", attrs)
			}
		}
		e := event.New()
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, err
		}
		return &e, nil
	}
	fields := map[string]string{}
	for k, v := range attrs {
		name, isCE := strings.CutPrefix(k, "ce-")
		switch {
		case strings.EqualFold(k, "content-type"):
			// The binding's name is content-type. sdk-go's Pub/Sub
			// binding writes Content-Type, which the sidecar gives back
			// as sent, beside content-type.
			if ct, ok := attrs["content-type"]; ok && ct != v {
				return nil, fmt.Errorf("%s %q and content-type %q differ", k, v, ct)
			}
			fields["datacontenttype"] = v
		case !isCE:
			return nil, fmt.Errorf("attribute %s=%q is not part of the event", k, v)
		default:
			fields[name] = v
		}
	}
	return binaryEvent(fields, data)
}

// binaryEvent builds the event a binary-mode message carries: fields are
// its context attributes and extensions by name, data its payload.
func binaryEvent(fields map[string]string, data []byte) (*event.Event, error) {
	e := event.New(fields["specversion"])
	for name, v := range fields {
		switch name {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "dataschema":
			e.SetDataSchema(v)
		case "datacontenttype":
			e.SetDataContentType(v)
		case "time":
			t, err := types.ParseTime(v)
			if err != nil {
				return nil, fmt.Errorf("ce-time %q: %v", v, err)
			}
			e.SetTime(t)
		default:
			e.SetExtension(name, v)
		}
	}
	if len(data) > 0 {
		e.DataEncoded = data
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// httpBindingMessage is an HTTP request read as a CloudEvents message the
// way sdk-go 2.16's protocol/http Message reads one: structured mode when
// the Content-Type names an event format, binary mode by ce-specversion,
// Content-Type as datacontenttype, every other Ce- header an attribute or
// an extension. Unlike sdk-go's reader, it percent-decodes the ce-* values
// as the HTTP binding requires (3.1.3.2), which the sidecar's push
// requests, as every conformant sender, rely on: sdk-go's own reader reads
// the id `évènement text 100% "quoted"` as
// `%C3%A9v%C3%A8nement%20text%20100%25%20%22quoted%22`
// (cloudevents/sdk-go#1331). That package is not imported for the same
// reason as in cloudevents_batch_test.go: it brings go.uber.org/zap into
// the module.
type httpBindingMessage struct {
	body    []byte
	format  format.Format // structured mode
	version spec.Version  // binary mode
	// Binary mode: the values by attribute or extension name, decoded.
	attrs map[string]string
}

var _ binding.MessageMetadataReader = (*httpBindingMessage)(nil) // binding.ToEvent needs it

// httpBindingSpecs maps attribute names to header names as sdk-go's
// protocol/http does.
var httpBindingSpecs = spec.WithPrefixMatchExact(func(name string) string {
	if name == "datacontenttype" {
		return "Content-Type"
	}
	return textproto.CanonicalMIMEHeaderKey("Ce-" + name)
}, "Ce-")

func newHTTPBindingMessage(r *http.Request) (*httpBindingMessage, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	m := &httpBindingMessage{body: body}
	if m.format = format.Lookup(r.Header.Get("Content-Type")); m.format != nil {
		return m, nil
	}
	if m.version = httpBindingSpecs.Version(r.Header.Get(httpBindingSpecs.PrefixedSpecVersionName())); m.version == nil {
		return m, nil // neither mode: binding.ToEvent says so
	}
	m.attrs = map[string]string{}
	for name, vals := range r.Header {
		var attr string
		if a := m.version.Attribute(name); a != nil {
			attr = a.Name()
		} else if ext, ok := strings.CutPrefix(name, "Ce-"); ok && ext != "" {
			attr = strings.ToLower(ext)
		} else {
			continue // not part of the event (User-Agent, ...)
		}
		v := vals[0]
		if attr != "datacontenttype" { // Content-Type is HTTP's own header, taken verbatim
			d, err := url.PathUnescape(v)
			if err != nil || !utf8.ValidString(d) {
				return nil, fmt.Errorf("header %s: %q is not percent-encoded UTF-8", name, v)
			}
			v = d
		}
		m.attrs[attr] = v
	}
	return m, nil
}

func (m *httpBindingMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *httpBindingMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.body))
}

func (m *httpBindingMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for _, name := range slices.Sorted(maps.Keys(m.attrs)) {
		var err error
		if a := m.attribute(name); a != nil {
			err = w.SetAttribute(a, m.attrs[name])
		} else {
			err = w.SetExtension(name, m.attrs[name])
		}
		if err != nil {
			return err
		}
	}
	if len(m.body) > 0 {
		return w.SetData(bytes.NewReader(m.body))
	}
	return nil
}

// attribute is the context attribute of that name, nil for an extension.
func (m *httpBindingMessage) attribute(name string) spec.Attribute {
	for _, a := range m.version.Attributes() {
		if a.Name() == name {
			return a
		}
	}
	return nil
}

func (m *httpBindingMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
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

func (m *httpBindingMessage) GetExtension(name string) any {
	if v, ok := m.attrs[name]; ok {
		return v
	}
	return nil
}

func (m *httpBindingMessage) Finish(error) error { return nil }

// fromNATSBinding reads a NATS message as the CloudEvents NATS protocol
// binding says: binary mode when there is a ce-specversion header (names
// are case-insensitive, ce-* values percent-decoded; the double-quoted
// values the binding also allows are left out, as no writer here makes
// them), structured JSON otherwise. datacontenttype is the
// content-type header taken verbatim, as sdk-go's NATS bindings and the
// HTTP binding take it, or ce-datacontenttype, which the binding names.
// jetorder's and NATS' own headers are no part of the event.
func fromNATSBinding(h nats.Header, data []byte) (*event.Event, error) {
	attrs := map[string]string{}
	for name, vals := range h {
		lower := strings.ToLower(name)
		if len(vals) == 0 || strings.HasPrefix(lower, "jetorder-") || strings.HasPrefix(lower, "nats-") {
			continue
		}
		v := vals[0]
		if attr, ok := strings.CutPrefix(lower, "ce-"); ok {
			d, err := url.PathUnescape(v)
			if err != nil || !utf8.ValidString(d) {
				return nil, fmt.Errorf("header %s: %q is not percent-encoded UTF-8", name, v)
			}
			attrs[attr] = d
			continue
		}
		if lower != "content-type" {
			return nil, fmt.Errorf("header %s=%q is not part of the event", name, v)
		}
		if _, ok := attrs["datacontenttype"]; !ok {
			attrs["datacontenttype"] = v
		}
	}
	if _, binary := attrs["specversion"]; !binary {
		e := event.New()
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, err
		}
		return &e, nil
	}
	return binaryEvent(attrs, data)
}

// eventDiff lists how got differs from want, attribute by attribute, after
// the canonicalisation the CloudEvents type system allows: times compare
// as instants (any RFC 3339 form is canonical), extensions by canonical
// string (binary modes carry only that; "Attribute values MAY be presented
// as native types or canonical strings"), and JSON data as JSON (the JSON
// event format embeds it as a value).
func eventDiff(want, got event.Event) []string {
	var diffs []string
	cmp := func(name, w, g string) {
		if w != g {
			diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", name, g, w))
		}
	}
	cmp("specversion", want.SpecVersion(), got.SpecVersion())
	cmp("id", want.ID(), got.ID())
	cmp("source", want.Source(), got.Source())
	cmp("type", want.Type(), got.Type())
	cmp("subject", want.Subject(), got.Subject())
	cmp("dataschema", want.DataSchema(), got.DataSchema())
	cmp("datacontenttype", want.DataContentType(), got.DataContentType())
	if !want.Time().Equal(got.Time()) {
		diffs = append(diffs, fmt.Sprintf("time = %v, want %v", got.Time(), want.Time()))
	}
	wd, gd := want.Data(), got.Data()
	if mt := want.DataMediaType(); mt == event.ApplicationJSON || strings.HasSuffix(mt, "+json") {
		var wc, gc bytes.Buffer
		if json.Compact(&wc, wd) == nil && json.Compact(&gc, gd) == nil {
			wd, gd = wc.Bytes(), gc.Bytes()
		}
	}
	if !bytes.Equal(wd, gd) {
		diffs = append(diffs, fmt.Sprintf("data = %q, want %q", gd, wd))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Extensions())) {
		ws, _ := types.Format(want.Extensions()[name])
		gv, ok := got.Extensions()[name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("extension %s missing, want %q", name, ws))
			continue
		}
		gs, err := types.Format(gv)
		if err != nil || gs != ws {
			diffs = append(diffs, fmt.Sprintf("extension %s = %q (%T, %v), want %q", name, gs, gv, err, ws))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got.Extensions())) {
		if _, ok := want.Extensions()[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("extension %s = %v, not sent", name, got.Extensions()[name]))
		}
	}
	return diffs
}
