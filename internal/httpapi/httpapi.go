package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/iam"
	"github.com/jetorder/jetorder/internal/status"
	"github.com/jetorder/jetorder/keyrouter"
)

// DefaultMaxBodyBytes bounds request bodies unless Config.MaxBodyBytes says
// otherwise: Pub/Sub's 10 MB limit on a publish request. Single messages
// are bounded by the adapter (the NATS server's max_payload).
const DefaultMaxBodyBytes = 10 << 20

// publishTimeout bounds a request's wait for its messages to be stored. It
// is a little longer than the adapter's own bound on retries, so a message
// that fails for good is answered with its own error rather than with a
// deadline.
var publishTimeout = adapter.DefaultPublishSettings.Timeout + 5*time.Second

const (
	// readyTimeout bounds a Config.Ready call.
	readyTimeout = 5 * time.Second
	// statusTimeout bounds the wait of a /v1/status request for the
	// sidecar's first read of JetStream.
	statusTimeout = 5 * time.Second
)

// Config configures the HTTP API.
type Config struct {
	// Broker publishes the messages and holds the metrics. Required.
	Broker *broker.Broker
	// DefaultProject is the project of the /v1/topics/... routes; when it
	// is empty, those routes answer 404.
	DefaultProject string
	// Ready reports whether the sidecar can serve: /readyz answers 200 when
	// it returns nil and 503 with its error text otherwise. Its ctx ends
	// after 5 seconds. nil checks that the broker's NATS connection is
	// connected.
	Ready func(ctx context.Context) error
	// Logger gets failed requests: server errors (5xx) at Warn, client
	// errors at Debug, panics at Error. nil discards everything.
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies; a larger one is answered 413.
	// Zero or less means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// PubSub serves the Pub/Sub REST API (rest.go): topics,
	// subscriptions and snapshots under /v1/projects/{project}/, and
	// :publish through its Publish. nil: only publish is served, straight
	// through the broker, and the other REST routes answer 404.
	PubSub PubSub
	// Schemas serves the SchemaService's REST routes under
	// /v1/projects/{project}/schemas (with PubSub set). nil: they answer
	// 404.
	Schemas pb.SchemaServiceServer
	// WebhookAllowedOrigins are the origins (WebHook-Request-Origin
	// values, such as eventemitter.example.com, compared without regard
	// to case) whose CloudEvents webhook validation requests on the
	// /events routes are granted; "*.example.com" allows the subdomains
	// of example.com, "*" every origin. Empty: every origin, since
	// publishing itself needs no credentials. The handshake protects
	// senders, not the API: a POST is not checked against this list.
	WebhookAllowedOrigins []string
	// WebhookAllowedRate is the rate, in requests per minute, granted to
	// an allowed origin in WebHook-Allowed-Rate; zero or less grants "*"
	// (no limit). The sidecar tells senders the rate but does not enforce
	// it.
	WebhookAllowedRate int
	// Status returns the sidecar's status, for GET /v1/status and the
	// status page at /; it may wait until ctx ends for a first reading.
	// nil: neither is served (404).
	Status func(ctx context.Context) *status.Status

	// Guard authenticates every request and authorizes it as the Pub/Sub
	// method it is or does needs (access.go); nil allows everything.
	Guard *iam.Guard
	// IAM serves the :getIamPolicy, :setIamPolicy and :testIamPermissions
	// routes of topics, subscriptions, snapshots and schemas (with PubSub
	// set), and is told of every REST call that succeeded, so that a
	// resource deleted loses its policy; nil: they answer 404.
	IAM IAMService
	// OpenPaths are the paths served to every caller with a Guard set:
	// any of /healthz, /readyz and /metrics.
	OpenPaths []string
}

// IAMService is the IAMPolicy service of Config.IAM. Its methods are
// called concurrently.
type IAMService interface {
	iampb.IAMPolicyServer
	// Done is told of every REST call that succeeded, by its request,
	// before the answer is written: it may block (*iam.Service's, for up
	// to 10 s while it drops a deleted resource's policy) and reports no
	// error.
	Done(ctx context.Context, req proto.Message)
}

var _ IAMService = (*iam.Service)(nil)

type api struct {
	b              *broker.Broker
	defaultProject string
	ready          func(context.Context) error
	log            *slog.Logger
	maxBody        int64
	mux            *http.ServeMux
	metricsHandler http.Handler
	pubsub         PubSub   // nil without the REST API
	rest           *restAPI // its routes; nil without it
	webhook        webhookPolicy
	status         func(context.Context) *status.Status // nil: no status page
	guard          *iam.Guard                           // nil: no access control
	iam            IAMService                           // nil: no IAMPolicy routes
	openPaths      []string
}

// New returns the HTTP API's handler (routes in the package comment). It
// is safe for concurrent use; every publish waits until its messages are
// stored, for at most a little over adapter.DefaultPublishSettings.Timeout, and
// ends early when the request's context does. New panics if cfg.Broker is
// nil.
func New(cfg Config) http.Handler {
	if cfg.Broker == nil {
		panic("httpapi: Config.Broker is nil")
	}
	a := &api{
		b:              cfg.Broker,
		defaultProject: cfg.DefaultProject,
		ready:          cfg.Ready,
		log:            cfg.Logger,
		maxBody:        cfg.MaxBodyBytes,
		mux:            http.NewServeMux(),
		metricsHandler: cfg.Broker.Metrics.Handler(),
		pubsub:         cfg.PubSub,
		webhook:        newWebhookPolicy(cfg.WebhookAllowedOrigins, cfg.WebhookAllowedRate),
		status:         cfg.Status,
		guard:          cfg.Guard,
		iam:            cfg.IAM,
		openPaths:      cfg.OpenPaths,
	}
	if a.ready == nil {
		a.ready = connected(a.b.Conn())
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.maxBody <= 0 {
		a.maxBody = DefaultMaxBodyBytes
	}
	// A ServeMux wildcard is a whole path segment, so "{topic}:publish"
	// is matched as one segment and split by topicAction. Methods are
	// checked by the handlers, so that a wrong one gets a JSON error too.
	a.mux.HandleFunc("/v1/projects/{project}/topics/{action}", a.inProject(a.topicAction))
	a.mux.HandleFunc("/v1/topics/{action}", a.inDefaultProject(a.topicAction))
	a.mux.HandleFunc("/v1/projects/{project}/topics/{topic}/events", a.inProject(a.events))
	a.mux.HandleFunc("/v1/topics/{topic}/events", a.inDefaultProject(a.events))
	a.mux.HandleFunc("/v1/projects/{project}/subscriptions/{subscription}/didcomm/threads/{thread}", a.inProject(a.didcommThread))
	a.mux.HandleFunc("/v1/projects/{project}/subscriptions/{subscription}/didcomm/threads/{$}", a.inProject(a.didcommThread))
	a.mux.HandleFunc("/v1/subscriptions/{subscription}/didcomm/threads/{thread}", a.inDefaultProject(a.didcommThread))
	a.mux.HandleFunc("/v1/subscriptions/{subscription}/didcomm/threads/{$}", a.inDefaultProject(a.didcommThread))
	if a.pubsub != nil {
		a.rest = newRESTAPI(a.pubsub, cfg.Schemas, cfg.IAM)
		a.restRoutes()
	}
	a.mux.HandleFunc("/healthz", a.healthz)
	a.mux.HandleFunc("/readyz", a.readyz)
	a.mux.HandleFunc("/metrics", a.metrics)
	if a.status != nil {
		a.mux.HandleFunc("/{$}", a.statusPage)
		a.mux.HandleFunc("/status/{file}", a.statusPage)
		a.mux.HandleFunc("/v1/status", a.statusJSON)
	}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, r, errorf(http.StatusNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return a
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if p == http.ErrAbortHandler { // net/http's way to abort a response: let it through
			panic(p)
		}
		a.log.Error("http handler panicked", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
		a.fail(w, r, errorf(http.StatusInternalServerError, "internal error: %v", p))
	}()
	if a.guard != nil && !slices.Contains(a.openPaths, r.URL.Path) {
		ctx, err := a.guard.AuthenticateHTTP(r)
		if err != nil {
			a.restFail(w, r, err)
			return
		}
		r = r.WithContext(ctx)
	}
	a.mux.ServeHTTP(w, r)
}

type projectHandler func(w http.ResponseWriter, r *http.Request, project string)

func (a *api) inProject(h projectHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { h(w, r, r.PathValue("project")) }
}

func (a *api) inDefaultProject(h projectHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.defaultProject == "" {
			a.fail(w, r, errorf(http.StatusNotFound, "no default project is configured: use /v1/projects/{project}%s", strings.TrimPrefix(r.URL.EscapedPath(), "/v1")))
			return
		}
		h(w, r, a.defaultProject)
	}
}

// topicAction serves topics/{topic}:publish and, with the REST API, the
// topic itself and its other verbs (:getIamPolicy, :setIamPolicy,
// :testIamPermissions) under /v1/projects/ (Google's REST API has no
// /v1/topics/{topic}).
func (a *api) topicAction(w http.ResponseWriter, r *http.Request, project string) {
	action := r.PathValue("action")
	i := strings.LastIndexByte(action, ':')
	if a.rest != nil && r.PathValue("project") != "" && (i < 0 || a.rest.topics.verbs[action[i+1:]] != nil) {
		// The topic itself, or one of its REST verbs other than :publish
		// (the IAM methods).
		a.restTopic(w, r, project, action)
		return
	}
	if i < 0 || action[i+1:] != "publish" {
		a.fail(w, r, errorf(http.StatusNotFound, "no route for %s %s: a topic has the method :publish and the path /events", r.Method, r.URL.Path))
		return
	}
	if !a.allow(w, r, http.MethodPost) || !a.mayPublish(w, r, project, action[:i]) {
		return
	}
	a.publish(w, r, project, action[:i])
}

// publishRequest is Pub/Sub's PublishRequest in its REST (JSON) form.
// Topic, optional, must be the URL's: Google's REST clients send it.
type publishRequest struct {
	Topic    *string         `json:"topic"`
	Messages []pubsubMessage `json:"messages"`
}

// pubsubMessage is a PubsubMessage as a publisher writes it. Pointers tell
// an absent field from an empty one: an absent orderingKey means no key,
// an empty one is an error.
type pubsubMessage struct {
	Data        *string           `json:"data"`
	Attributes  map[string]string `json:"attributes"`
	OrderingKey *string           `json:"orderingKey"`
}

type publishResponse struct {
	MessageIDs []string `json:"messageIds"`
}

// maxMessagesPerRequest is Pub/Sub's limit on messages in one publish.
const maxMessagesPerRequest = 1000

func (a *api) publish(w http.ResponseWriter, r *http.Request, project, topic string) {
	if err := validateNames(project, topic); err != nil {
		a.fail(w, r, err)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && mediaType(ct) != "application/json" {
		a.fail(w, r, errorf(http.StatusUnsupportedMediaType, "Content-Type %q is not supported: use application/json", ct))
		return
	}
	body, err := a.readBody(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	msgs, err := a.parsePublish(body, resourceName(project, "topics", topic))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ids, err := a.publishMessages(r, project, topic, msgs)
	if err != nil {
		a.restFail(w, r, err)
		return
	}
	a.writeJSON(w, http.StatusOK, publishResponse{MessageIDs: ids})
}

// parsePublish reads a publish request and checks what only JSON can get
// wrong; the broker checks every message against the adapter's rules
// before it stores any.
func (a *api) parsePublish(body []byte, topic string) ([]*adapter.Message, error) {
	if !utf8.Valid(body) {
		// encoding/json would turn the bad bytes into U+FFFD, changing an
		// ordering key or attribute without a word.
		return nil, errorf(http.StatusBadRequest, "invalid JSON: the body is not UTF-8")
	}
	var req publishRequest
	if err := decodeJSON(body, &req); err != nil {
		return nil, err
	}
	if err := checkSurrogates(body); err != nil {
		return nil, err
	}
	if req.Topic != nil && *req.Topic != topic {
		return nil, errorf(http.StatusBadRequest, "the body's topic %q is not the topic of the URL, %q: leave it out or make them the same", *req.Topic, topic)
	}
	switch n := len(req.Messages); {
	case n == 0:
		return nil, errorf(http.StatusBadRequest, "messages must not be empty")
	case n > maxMessagesPerRequest:
		return nil, errorf(http.StatusBadRequest, "%d messages in one request, at most %d", n, maxMessagesPerRequest)
	}
	msgs := make([]*adapter.Message, len(req.Messages))
	for i, pm := range req.Messages {
		m := &adapter.Message{Attributes: pm.Attributes}
		if pm.Data != nil {
			data, err := decodeBase64(*pm.Data)
			if err != nil {
				return nil, errorf(http.StatusBadRequest, "messages[%d].data is not base64: %v", i, err)
			}
			m.Data = data
		}
		if pm.OrderingKey != nil {
			// The key errors keep Pub/Sub's exact texts.
			if err := keyrouter.ValidateOrderingKey(*pm.OrderingKey); err != nil {
				return nil, badRequest(err)
			}
			m.OrderingKey = *pm.OrderingKey
		}
		if len(m.Data) == 0 && len(m.Attributes) == 0 {
			return nil, errorf(http.StatusBadRequest, "messages[%d] is empty: a message needs data or at least one attribute", i)
		}
		msgs[i] = m
	}
	return msgs, nil
}

// send publishes msgs and waits until every one is stored.
func (a *api) send(r *http.Request, project, topic string, msgs []*adapter.Message) ([]string, error) {
	ctx, cancel := context.WithTimeout(r.Context(), publishTimeout)
	defer cancel()
	return a.b.Publish(ctx, project, topic, msgs)
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) {
		return
	}
	writeText(w, http.StatusOK, "ok\n")
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := a.ready(ctx); err != nil {
		a.log.Debug("not ready", "err", err)
		writeText(w, http.StatusServiceUnavailable, err.Error()+"\n")
		return
	}
	writeText(w, http.StatusOK, "ok\n")
}

func (a *api) metrics(w http.ResponseWriter, r *http.Request) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) || !a.mayReadMetrics(w, r) {
		return
	}
	a.metricsHandler.ServeHTTP(w, r)
}

// statusPage serves the status page and its assets.
func (a *api) statusPage(w http.ResponseWriter, r *http.Request) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) || !a.mayReadStatus(w, r) {
		return
	}
	status.Page.ServeHTTP(w, r)
}

// statusJSON serves the sidecar's status (status.Status) as JSON.
func (a *api) statusJSON(w http.ResponseWriter, r *http.Request) {
	if !a.allow(w, r, http.MethodGet, http.MethodHead) || !a.mayReadStatus(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), statusTimeout)
	defer cancel()
	st := a.visibleStatus(r.Context(), a.status(ctx))
	w.Header().Set("Cache-Control", "no-store")
	a.writeJSON(w, http.StatusOK, st)
}

// connected is the default readiness check: the NATS connection is up.
func connected(nc *nats.Conn) func(context.Context) error {
	return func(context.Context) error {
		if s := nc.Status(); s != nats.CONNECTED {
			return fmt.Errorf("NATS connection is %s", s)
		}
		return nil
	}
}

// natsDown reports whether the broker's NATS connection is not connected
// (reconnecting, closed).
func (a *api) natsDown() bool {
	nc := a.b.Conn()
	return nc != nil && !nc.IsConnected()
}

// allow answers 405 unless the request's method is one of methods.
func (a *api) allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	if slices.Contains(methods, r.Method) {
		return true
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	a.fail(w, r, errorf(http.StatusMethodNotAllowed, "method %s is not allowed on %s: use %s", r.Method, r.URL.Path, strings.Join(methods, " or ")))
	return false
}

func validateNames(project, topic string) error {
	if err := keyrouter.ValidateProjectID(project); err != nil {
		return badRequest(err)
	}
	if err := keyrouter.ValidateTopicID(topic); err != nil {
		return badRequest(err)
	}
	return nil
}

// maxBodyPrealloc bounds what readBody allocates before the body arrives.
const maxBodyPrealloc = 64 << 10

// readBody reads the whole body, up to the limit.
func (a *api) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > a.maxBody {
		return nil, errorf(http.StatusRequestEntityTooLarge, "request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, a.maxBody)
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// Not more up front: a client that declares a large body and
		// sends none would otherwise hold that much memory per request.
		buf.Grow(int(min(r.ContentLength, maxBodyPrealloc)))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, a.maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, errorf(http.StatusRequestEntityTooLarge, "request body exceeds the limit of %d bytes", a.maxBody)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, errorf(http.StatusBadRequest, "request body truncated: it ended before its declared length")
	case err != nil:
		return nil, errorf(http.StatusBadRequest, "reading the request body: %v", err)
	}
	return buf.Bytes(), nil
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    int    `json:"code"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

// fail answers a request with err, as a Google-style JSON error.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	if code == http.StatusInternalServerError && a.natsDown() {
		// Some nats.go errors lose what they wrap (jetstream's "error
		// creating async reply handler" formats a closed connection
		// with %s), so the connection's state decides.
		code = http.StatusServiceUnavailable
	}
	attrs := []any{"method", r.Method, "path", r.URL.Path, "status", code, "err", err}
	if code >= 500 && r.Context().Err() == nil {
		a.log.Warn("http request failed", attrs...)
	} else {
		a.log.Debug("http request failed", attrs...)
	}
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	a.writeJSON(w, code, errorBody{errorDetail{Code: code, Status: statusName(code), Message: err.Error()}})
}

func (a *api) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		a.log.Debug("write response", "err", err) // the client went away
	}
}

func writeText(w http.ResponseWriter, code int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, s) // an error means the client went away
}
