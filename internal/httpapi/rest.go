package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/jetorder/jetorder/adapter"
)

// PubSub is the Google Pub/Sub v1 service behind the REST routes: each
// route decodes its request as the method's google.api.http rule says and
// calls the method of the same name, so REST and gRPC clients get the same
// checks, texts and results. The sidecar's gRPC server
// (*pubsubapi.Server) implements it.
//
// Its methods must be safe for concurrent use. They may block until ctx
// ends (Pull waits for messages), and must return soon after it does.
// Their errors should be gRPC statuses: the REST answer is the status's
// HTTP mapping, its canonical name and its message (details too); any
// other error is answered as the publish routes answer theirs, 500 unless
// it is a known adapter error. Methods a server does not have answer
// UNIMPLEMENTED (501) through the embedded pb.Unimplemented*Server.
type PubSub interface {
	pb.PublisherServer
	pb.SubscriberServer
}

// restTimeout bounds one REST call to the PubSub service, publish aside
// (publishTimeout). It is longer than a Pull's wait for messages.
const restTimeout = 60 * time.Second

// restMethod is one RPC as Google's REST API serves it (its
// google.api.http rule in google/pubsub/v1/pubsub.proto).
type restMethod struct {
	rpc string // the RPC's name, for errors
	// field is the request field the URL's resource name fills, a
	// dotted path of proto names: "name", "topic.name", "project".
	field string
	// body is the rule's body: "*", the JSON body is the request; a field
	// name, the body is that field ("schema") and the other fields come
	// from the query string; "", no body, every other field from the
	// query string.
	body string
	// method is the HTTP method of a custom verb ({resource}:{verb}):
	// POST unless on sets another.
	method string
	newReq func() proto.Message
	call   func(context.Context, proto.Message) (proto.Message, error)
	// also is the same RPC under another HTTP method and body rule
	// (getIamPolicy: GET with the query, or POST with a body); nil for most.
	also *restMethod
}

// rpc describes a method of the PubSub service. It panics if field is not
// a string field of the request, a programming error.
func rpc[Req, Resp proto.Message](name, field, body string, call func(context.Context, Req) (Resp, error)) *restMethod {
	var zero Req
	typ := zero.ProtoReflect().Type()
	if fieldOf(typ.New(), field) == nil {
		panic(fmt.Sprintf("httpapi: %s has no string field %s", typ.Descriptor().FullName(), field))
	}
	if fd := typ.Descriptor().Fields().ByName(protoreflect.Name(body)); body != "" && body != "*" && (fd == nil || fd.Kind() != protoreflect.MessageKind) {
		panic(fmt.Sprintf("httpapi: %s has no message field %s", typ.Descriptor().FullName(), body))
	}
	return &restMethod{
		rpc:    name,
		field:  field,
		body:   body,
		method: http.MethodPost,
		newReq: func() proto.Message { return typ.New().Interface() },
		call: func(ctx context.Context, req proto.Message) (proto.Message, error) {
			return call(ctx, req.(Req))
		},
	}
}

// on sets the HTTP method of a custom verb.
func (m *restMethod) on(method string) *restMethod {
	m.method = method
	return m
}

// or serves the call as m, or as m.also when r's method is its.
func (m *restMethod) or(r *http.Request) *restMethod {
	if m.also != nil && r.Method == m.also.method {
		return m.also
	}
	return m
}

// methods are the HTTP methods m is served with.
func (m *restMethod) methods() []string {
	if m.also != nil {
		return []string{m.method, m.also.method}
	}
	return []string{m.method}
}

// restCollection is a collection of resources, projects/{project}/{kind},
// and the methods on it and on its resources.
type restCollection struct {
	kind string // "topics", "subscriptions", "snapshots", "schemas"
	list *restMethod
	// create is POST on the collection (schemas: the id in the query),
	// and collectionVerbs POST {kind}:{verb}; nil for the others.
	create          *restMethod
	collectionVerbs map[string]*restMethod
	// The standard methods on a resource, by HTTP method: PUT creates,
	// GET gets, PATCH updates, DELETE deletes.
	standard map[string]*restMethod
	verbs    map[string]*restMethod // {resource}:{verb}, by their own HTTP method
	lists    map[string]*restMethod // GET {resource}/{what}
}

// restAPI is the REST routes' view of the service.
type restAPI struct {
	topics, subscriptions, snapshots *restCollection
	schemas                          *restCollection // nil without a SchemaService
}

func newRESTAPI(s PubSub, schemas pb.SchemaServiceServer, policies iampb.IAMPolicyServer) *restAPI {
	api := &restAPI{
		topics: &restCollection{
			kind: "topics",
			list: rpc("ListTopics", "project", "", s.ListTopics),
			standard: map[string]*restMethod{
				http.MethodPut:    rpc("CreateTopic", "name", "*", s.CreateTopic),
				http.MethodGet:    rpc("GetTopic", "topic", "", s.GetTopic),
				http.MethodPatch:  rpc("UpdateTopic", "topic.name", "*", s.UpdateTopic),
				http.MethodDelete: rpc("DeleteTopic", "topic", "", s.DeleteTopic),
			},
			// :publish is served by publish, which keeps the HTTP
			// API's own checks and texts.
			lists: map[string]*restMethod{
				"subscriptions": rpc("ListTopicSubscriptions", "topic", "", s.ListTopicSubscriptions),
				"snapshots":     rpc("ListTopicSnapshots", "topic", "", s.ListTopicSnapshots),
			},
		},
		subscriptions: &restCollection{
			kind: "subscriptions",
			list: rpc("ListSubscriptions", "project", "", s.ListSubscriptions),
			standard: map[string]*restMethod{
				http.MethodPut:    rpc("CreateSubscription", "name", "*", s.CreateSubscription),
				http.MethodGet:    rpc("GetSubscription", "subscription", "", s.GetSubscription),
				http.MethodPatch:  rpc("UpdateSubscription", "subscription.name", "*", s.UpdateSubscription),
				http.MethodDelete: rpc("DeleteSubscription", "subscription", "", s.DeleteSubscription),
			},
			verbs: map[string]*restMethod{
				"pull":              rpc("Pull", "subscription", "*", s.Pull),
				"acknowledge":       rpc("Acknowledge", "subscription", "*", s.Acknowledge),
				"modifyAckDeadline": rpc("ModifyAckDeadline", "subscription", "*", s.ModifyAckDeadline),
				"modifyPushConfig":  rpc("ModifyPushConfig", "subscription", "*", s.ModifyPushConfig),
				"seek":              rpc("Seek", "subscription", "*", s.Seek),
				"detach":            rpc("DetachSubscription", "subscription", "", s.DetachSubscription),
			},
		},
		snapshots: &restCollection{
			kind: "snapshots",
			list: rpc("ListSnapshots", "project", "", s.ListSnapshots),
			standard: map[string]*restMethod{
				http.MethodPut:    rpc("CreateSnapshot", "name", "*", s.CreateSnapshot),
				http.MethodGet:    rpc("GetSnapshot", "snapshot", "", s.GetSnapshot),
				http.MethodPatch:  rpc("UpdateSnapshot", "snapshot.name", "*", s.UpdateSnapshot),
				http.MethodDelete: rpc("DeleteSnapshot", "snapshot", "", s.DeleteSnapshot),
			},
		},
	}
	if schemas != nil {
		// google/pubsub/v1/schema.proto's rules.
		api.schemas = &restCollection{
			kind:   "schemas",
			list:   rpc("ListSchemas", "parent", "", schemas.ListSchemas),
			create: rpc("CreateSchema", "parent", "schema", schemas.CreateSchema),
			collectionVerbs: map[string]*restMethod{
				"validate":        rpc("ValidateSchema", "parent", "*", schemas.ValidateSchema),
				"validateMessage": rpc("ValidateMessage", "parent", "*", schemas.ValidateMessage),
			},
			standard: map[string]*restMethod{
				http.MethodGet:    rpc("GetSchema", "name", "", schemas.GetSchema),
				http.MethodDelete: rpc("DeleteSchema", "name", "", schemas.DeleteSchema),
			},
			verbs: map[string]*restMethod{
				"commit":         rpc("CommitSchema", "name", "*", schemas.CommitSchema),
				"rollback":       rpc("RollbackSchema", "name", "*", schemas.RollbackSchema),
				"listRevisions":  rpc("ListSchemaRevisions", "name", "", schemas.ListSchemaRevisions).on(http.MethodGet),
				"deleteRevision": rpc("DeleteSchemaRevision", "name", "", schemas.DeleteSchemaRevision).on(http.MethodDelete),
			},
		}
	}
	if policies != nil {
		// google/pubsub/v1's service configuration: the IAMPolicy methods
		// on each kind of resource, getIamPolicy as GET with
		// options.requestedPolicyVersion in the query (the POST of
		// iam_policy.proto's own rule is served too).
		get := rpc("GetIamPolicy", "resource", "", policies.GetIamPolicy).on(http.MethodGet)
		get.also = rpc("GetIamPolicy", "resource", "*", policies.GetIamPolicy)
		for _, c := range []*restCollection{api.topics, api.subscriptions, api.snapshots, api.schemas} {
			if c == nil {
				continue
			}
			if c.verbs == nil {
				c.verbs = map[string]*restMethod{}
			}
			c.verbs["getIamPolicy"] = get
			c.verbs["setIamPolicy"] = rpc("SetIamPolicy", "resource", "*", policies.SetIamPolicy)
			c.verbs["testIamPermissions"] = rpc("TestIamPermissions", "resource", "*", policies.TestIamPermissions)
		}
	}
	return api
}

// restRoutes adds the REST routes other than topics/{topic} and
// {topic}:publish, which topicAction serves. ServeMux wildcards are whole
// segments: "{subscription}:pull" is one, split by restResource.
func (a *api) restRoutes() {
	collections := []*restCollection{a.rest.topics, a.rest.subscriptions, a.rest.snapshots}
	if a.rest.schemas != nil {
		collections = append(collections, a.rest.schemas)
	}
	for _, c := range collections {
		a.mux.HandleFunc("/v1/projects/{project}/"+c.kind, a.inProject(func(w http.ResponseWriter, r *http.Request, project string) {
			switch {
			case c.create != nil && r.Method == http.MethodPost:
				a.serveREST(w, r, c.create, "projects/"+project)
			case c.create != nil:
				if a.allow(w, r, http.MethodGet, http.MethodPost) {
					a.serveREST(w, r, c.list, "projects/"+project)
				}
			case a.allow(w, r, http.MethodGet):
				a.serveREST(w, r, c.list, "projects/"+project)
			}
		}))
		for verb, m := range c.collectionVerbs {
			a.mux.HandleFunc("/v1/projects/{project}/"+c.kind+":"+verb, a.inProject(func(w http.ResponseWriter, r *http.Request, project string) {
				if a.allow(w, r, m.method) {
					a.serveREST(w, r, m, "projects/"+project)
				}
			}))
		}
		if c != a.rest.topics { // topics/{action} is topicAction's
			a.mux.HandleFunc("/v1/projects/{project}/"+c.kind+"/{resource}", a.inProject(func(w http.ResponseWriter, r *http.Request, project string) {
				a.restResource(w, r, c, project, r.PathValue("resource"))
			}))
		}
		for what, m := range c.lists {
			a.mux.HandleFunc("/v1/projects/{project}/"+c.kind+"/{resource}/"+what, a.inProject(func(w http.ResponseWriter, r *http.Request, project string) {
				if a.allow(w, r, http.MethodGet) {
					a.serveREST(w, r, m, resourceName(project, c.kind, r.PathValue("resource")))
				}
			}))
		}
	}
}

// restTopic serves the topic resource, projects/{project}/topics/{topic}.
func (a *api) restTopic(w http.ResponseWriter, r *http.Request, project, topic string) {
	a.restResource(w, r, a.rest.topics, project, topic)
}

// restResource serves {kind}/{id} and {kind}/{id}:{verb}.
func (a *api) restResource(w http.ResponseWriter, r *http.Request, c *restCollection, project, segment string) {
	id, verb, custom := segment, "", false
	if i := strings.LastIndexByte(segment, ':'); i >= 0 {
		id, verb, custom = segment[:i], segment[i+1:], true
	}
	name := resourceName(project, c.kind, id)
	if !custom {
		m := c.standard[r.Method]
		if m == nil {
			var methods []string
			for _, m := range []string{http.MethodPut, http.MethodGet, http.MethodPatch, http.MethodDelete} {
				if c.standard[m] != nil {
					methods = append(methods, m)
				}
			}
			a.allow(w, r, methods...)
			return
		}
		a.serveREST(w, r, m, name)
		return
	}
	m := c.verbs[verb]
	if m == nil {
		verbs := make([]string, 0, len(c.verbs))
		for v := range c.verbs {
			verbs = append(verbs, ":"+v)
		}
		slices.Sort(verbs)
		a.fail(w, r, errorf(http.StatusNotFound, "no route for %s %s: %s has no method :%s (it has %s)",
			r.Method, r.URL.Path, strings.TrimSuffix(c.kind, "s"), verb, orNone(strings.Join(verbs, ", "))))
		return
	}
	if a.allow(w, r, m.methods()...) {
		a.serveREST(w, r, m.or(r), name)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// resourceName is projects/{project}/{kind}/{id}, as the path gave them
// (percent-decoded): the service checks them, with gRPC's texts.
func resourceName(project, kind, id string) string {
	return "projects/" + project + "/" + kind + "/" + id
}

// serveREST answers one REST call of m on the resource name.
func (a *api) serveREST(w http.ResponseWriter, r *http.Request, m *restMethod, name string) {
	// A ';' is part of a value, not a separator, as for browsers and
	// net/http since Go 1.17: $alt=json;enum-encoding=int unescaped.
	query, err := url.ParseQuery(strings.ReplaceAll(r.URL.RawQuery, ";", "%3B"))
	if err != nil {
		a.fail(w, r, errorf(http.StatusBadRequest, "invalid query string: %v", err))
		return
	}
	opts, err := restQueryOptions(query)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	req := m.newReq()
	if m.body != "" {
		if err := a.decodeBody(w, r, bodyOf(req, m.body)); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	if err := bindName(req.ProtoReflect(), m.field, name); err != nil {
		a.fail(w, r, err)
		return
	}
	if err := bindQuery(req.ProtoReflect(), query, m); err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), restTimeout)
	defer cancel()
	if err := a.guard.Authorize(ctx, m.rpc, req); err != nil {
		a.restFail(w, r, err)
		return
	}
	resp, err := m.call(ctx, req)
	if err != nil {
		a.restFail(w, r, err)
		return
	}
	if a.iam != nil {
		a.iam.Done(ctx, req)
	}
	a.writeProto(w, r, resp, opts)
}

// decodeBody reads a JSON request body into req with protobuf's JSON
// mapping (lowerCamelCase names, or the proto names; bytes in base64),
// refusing unknown fields. An empty body is an empty request.
func (a *api) decodeBody(w http.ResponseWriter, r *http.Request, req proto.Message) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && mediaType(ct) != "application/json" {
		return errorf(http.StatusUnsupportedMediaType, "Content-Type %q is not supported: use application/json", ct)
	}
	body, err := a.readBody(w, r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := protojson.Unmarshal(body, req); err != nil {
		return errorf(http.StatusBadRequest, "invalid JSON: %s", protoErrorText(err))
	}
	return nil
}

// queryNames reports whether the query parameter key names req's field
// field, or a field in it (by its JSON or proto name).
func queryNames(req protoreflect.Message, key, field string) bool {
	first, _, _ := strings.Cut(key, ".")
	fds := req.Descriptor().Fields()
	fd := fds.ByJSONName(first)
	if fd == nil {
		fd = fds.ByName(protoreflect.Name(first))
	}
	return fd != nil && string(fd.Name()) == field
}

// bodyOf is what a JSON body fills in req: req itself for body "*", or
// its message field body.
func bodyOf(req proto.Message, body string) proto.Message {
	if body == "*" {
		return req
	}
	m := req.ProtoReflect()
	return m.Mutable(m.Descriptor().Fields().ByName(protoreflect.Name(body))).Message().Interface()
}

// protoErrorText is a protobuf error's text without its "proto: " prefix
// (whose space protobuf-go makes a no-break space at random).
func protoErrorText(err error) string {
	s := err.Error()
	for _, p := range []string{"proto: ", "proto:\u00a0"} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// fieldOf is the string field at path (proto names, dot-separated) of m's
// type, with the message holding it, made mutable: nil if there is none.
func fieldOf(m protoreflect.Message, path string) *boundField {
	parts := strings.Split(path, ".")
	for i, p := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(p))
		switch {
		case fd == nil || fd.IsList() || fd.IsMap():
			return nil
		case i == len(parts)-1:
			if fd.Kind() != protoreflect.StringKind {
				return nil
			}
			return &boundField{m: m, fd: fd}
		case fd.Kind() != protoreflect.MessageKind:
			return nil
		}
		m = m.Mutable(fd).Message()
	}
	return nil
}

type boundField struct {
	m  protoreflect.Message
	fd protoreflect.FieldDescriptor
}

// bindName puts the URL's resource name in req's field path. A body that
// names another resource is refused, so that PUT .../topics/a with
// {"name": "projects/p/topics/b"} creates neither.
func bindName(req protoreflect.Message, path, name string) error {
	f := fieldOf(req, path)
	if got := f.m.Get(f.fd).String(); got != "" && got != name {
		return errorf(http.StatusBadRequest, "the body's %s %q is not the resource of the URL, %q: leave it out or make them the same", jsonPath(req, path), got, name)
	}
	f.m.Set(f.fd, protoreflect.ValueOfString(name))
	return nil
}

// jsonPath is path (proto names) in lowerCamelCase JSON names.
func jsonPath(m protoreflect.Message, path string) string {
	var out []string
	d := m.Descriptor()
	for p := range strings.SplitSeq(path, ".") {
		fd := d.Fields().ByName(protoreflect.Name(p))
		out = append(out, fd.JSONName())
		if fd.Message() != nil {
			d = fd.Message()
		}
	}
	return strings.Join(out, ".")
}

// restOptions are what the system query parameters ask of the answer.
type restOptions struct {
	enumNumbers bool // $alt=json;enum-encoding=int: enums as numbers
}

// systemParams are the query parameters every Google REST API takes
// (https://cloud.google.com/apis/docs/system-parameters), with or without
// a leading '$'. Only alt changes anything here; the others are accepted
// and ignored.
var systemParams = map[string]bool{
	"alt": true, "fields": true, "key": true, "prettyPrint": true, "quotaUser": true,
	"callback": true, "access_token": true, "oauth_token": true, "upload_protocol": true,
	"uploadType": true, ".xgafv": true, "userIp": true, "userProject": true,
}

func systemParam(key string) (string, bool) {
	k := strings.TrimPrefix(key, "$")
	return k, systemParams[k]
}

// restQueryOptions reads the system parameters of a query.
func restQueryOptions(query url.Values) (restOptions, error) {
	var o restOptions
	for key, vals := range query {
		if k, ok := systemParam(key); !ok || k != "alt" {
			continue
		}
		for _, v := range vals {
			format, params, _ := strings.Cut(v, ";")
			if strings.TrimSpace(format) != "json" {
				return o, errorf(http.StatusBadRequest, "%s=%q is not supported: the answer is JSON (alt=json)", key, v)
			}
			for p := range strings.SplitSeq(params, ";") {
				switch strings.ReplaceAll(p, " ", "") {
				case "":
				case "enum-encoding=int":
					o.enumNumbers = true
				case "enum-encoding=string":
					o.enumNumbers = false
				default:
					return o, errorf(http.StatusBadRequest, "%s=%q: unknown parameter %q", key, v, p)
				}
			}
		}
	}
	return o, nil
}

// bindQuery sets the fields a body-less method takes from the query
// string, as Google's HTTP rules bind them: a parameter names a field by
// its JSON or proto name (dotted for a nested one), a repeated field may
// be given more than once, and values are read as protobuf's JSON mapping
// reads them. Unknown parameters are refused, as the service refuses
// them, and so are parameters for methods whose body is the request.
func bindQuery(req protoreflect.Message, query url.Values, m *restMethod) error {
	keys := make([]string, 0, len(query))
	for k := range query {
		if _, ok := systemParam(k); !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, key := range keys {
		if m.body == "*" || m.body != "" && queryNames(req, key, m.body) {
			return errorf(http.StatusBadRequest, "query parameter %q is not allowed: %s takes its fields in the JSON body", key, m.rpc)
		}
		if err := setQueryField(req, key, query[key], m.field); err != nil {
			return err
		}
	}
	return nil
}

func setQueryField(req protoreflect.Message, key string, vals []string, bound string) error {
	unknown := func() error {
		return errorf(http.StatusBadRequest, "unknown query parameter %q: %s has no such field", key, req.Descriptor().Name())
	}
	m := req
	parts := strings.Split(key, ".")
	var protoPath []string
	for i, p := range parts {
		fds := m.Descriptor().Fields()
		fd := fds.ByJSONName(p)
		if fd == nil {
			fd = fds.ByName(protoreflect.Name(p))
		}
		if fd == nil {
			return unknown()
		}
		protoPath = append(protoPath, string(fd.Name()))
		if i == len(parts)-1 {
			if strings.Join(protoPath, ".") == bound {
				return errorf(http.StatusBadRequest, "query parameter %q is not allowed: the URL's path gives it", key)
			}
			return setQueryValue(m, fd, key, vals)
		}
		if fd.Kind() != protoreflect.MessageKind || fd.IsList() || fd.IsMap() {
			return unknown()
		}
		m = m.Mutable(fd).Message()
	}
	return unknown()
}

// setQueryValue sets fd of m from the query values, through protojson so
// that they are read and checked as in a body.
func setQueryValue(m protoreflect.Message, fd protoreflect.FieldDescriptor, key string, vals []string) error {
	if fd.IsMap() || fd.IsList() && fd.Kind() == protoreflect.MessageKind {
		return errorf(http.StatusBadRequest, "query parameter %q: a field of that type cannot be given in the query string", key)
	}
	if !fd.IsList() && len(vals) > 1 {
		return errorf(http.StatusBadRequest, "query parameter %q is given %d times: it is not repeated", key, len(vals))
	}
	js := make([]json.RawMessage, len(vals))
	for i, v := range vals {
		js[i] = queryJSON(fd, v)
	}
	var value any = js[0]
	if fd.IsList() {
		value = js
	}
	doc, err := json.Marshal(map[string]any{fd.JSONName(): value})
	if err != nil {
		return errorf(http.StatusBadRequest, "query parameter %q: %v", key, err)
	}
	tmp := m.New()
	if err := protojson.Unmarshal(doc, tmp.Interface()); err != nil {
		return errorf(http.StatusBadRequest, "query parameter %q: %s", key, protoErrorText(err))
	}
	if fd.IsList() {
		m.Clear(fd)
	}
	proto.Merge(m.Interface(), tmp.Interface())
	return nil
}

// queryJSON is a query value as the JSON protojson reads for fd: booleans
// and enum numbers bare, everything else (numbers too, which protobuf's
// JSON mapping takes as strings) a JSON string.
func queryJSON(fd protoreflect.FieldDescriptor, v string) json.RawMessage {
	bare := false
	switch fd.Kind() {
	case protoreflect.BoolKind:
		bare = v == "true" || v == "false"
	case protoreflect.EnumKind:
		_, err := strconv.ParseInt(v, 10, 32)
		bare = err == nil
	case protoreflect.MessageKind:
		bare = fd.Message().FullName() == "google.protobuf.BoolValue" && (v == "true" || v == "false")
	}
	if bare {
		return json.RawMessage(v)
	}
	s, _ := json.Marshal(v) // a Go string: never fails
	return s
}

// writeProto answers 200 with resp in protobuf's JSON mapping, as Google's
// REST API does: lowerCamelCase names, fields at their default left out,
// an empty response as {}.
func (a *api) writeProto(w http.ResponseWriter, r *http.Request, resp proto.Message, o restOptions) {
	b, err := protojson.MarshalOptions{UseEnumNumbers: o.enumNumbers}.Marshal(resp)
	if err != nil {
		a.fail(w, r, errorf(http.StatusInternalServerError, "encode the response: %s", protoErrorText(err)))
		return
	}
	var out bytes.Buffer
	_ = json.Compact(&out, b) // protojson's output is valid JSON; its spacing varies between builds
	out.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(out.Bytes()); err != nil {
		a.log.Debug("write response", "err", err) // the client went away
	}
}

// publishMessages stores msgs: through the PubSub service's Publish when
// there is one, so that HTTP and gRPC publishing share its checks (the
// topic's schema) and storage (CloudEvents attributes as headers), else
// straight through the broker.
func (a *api) publishMessages(r *http.Request, project, topic string, msgs []*adapter.Message) ([]string, error) {
	if a.pubsub == nil {
		return a.send(r, project, topic, msgs)
	}
	req := &pb.PublishRequest{Topic: resourceName(project, "topics", topic), Messages: make([]*pb.PubsubMessage, len(msgs))}
	for i, m := range msgs {
		req.Messages[i] = &pb.PubsubMessage{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey}
	}
	ctx, cancel := context.WithTimeout(r.Context(), publishTimeout)
	defer cancel()
	resp, err := a.pubsub.Publish(ctx, req)
	if err != nil {
		// The publish routes answer a request whose time ran out 503
		// with Retry-After (docs/HTTP.md), not 504.
		if c := status.Code(err); c == codes.DeadlineExceeded || c == codes.Canceled {
			err = status.Error(codes.Unavailable, status.Convert(err).Message())
		}
		return nil, err
	}
	return resp.GetMessageIds(), nil
}

// restCode is how Google's REST APIs answer a gRPC code: the HTTP status
// of google.rpc.Code's mapping and the code's canonical name.
var restCode = map[codes.Code]struct {
	http int
	name string
}{
	codes.Canceled:           {499, "CANCELLED"},
	codes.Unknown:            {http.StatusInternalServerError, "UNKNOWN"},
	codes.InvalidArgument:    {http.StatusBadRequest, "INVALID_ARGUMENT"},
	codes.DeadlineExceeded:   {http.StatusGatewayTimeout, "DEADLINE_EXCEEDED"},
	codes.NotFound:           {http.StatusNotFound, "NOT_FOUND"},
	codes.AlreadyExists:      {http.StatusConflict, "ALREADY_EXISTS"},
	codes.PermissionDenied:   {http.StatusForbidden, "PERMISSION_DENIED"},
	codes.ResourceExhausted:  {http.StatusTooManyRequests, "RESOURCE_EXHAUSTED"},
	codes.FailedPrecondition: {http.StatusBadRequest, "FAILED_PRECONDITION"},
	codes.Aborted:            {http.StatusConflict, "ABORTED"},
	codes.OutOfRange:         {http.StatusBadRequest, "OUT_OF_RANGE"},
	codes.Unimplemented:      {http.StatusNotImplemented, "UNIMPLEMENTED"},
	codes.Internal:           {http.StatusInternalServerError, "INTERNAL"},
	codes.Unavailable:        {http.StatusServiceUnavailable, "UNAVAILABLE"},
	codes.DataLoss:           {http.StatusInternalServerError, "DATA_LOSS"},
	codes.Unauthenticated:    {http.StatusUnauthorized, "UNAUTHENTICATED"},
}

// restErrorBody is Google's REST error, details included.
type restErrorBody struct {
	Error restErrorDetail `json:"error"`
}

type restErrorDetail struct {
	Code    int               `json:"code"`
	Status  string            `json:"status"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details,omitempty"`
}

// restFail answers a request with err: a gRPC status as Google's REST API
// answers it (its HTTP status, canonical name, message and details, each
// detail as JSON with its "@type"); any other error as fail does.
func (a *api) restFail(w http.ResponseWriter, r *http.Request, err error) {
	var withStatus interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &withStatus) {
		a.fail(w, r, err)
		return
	}
	st := status.Convert(err)
	rc, ok := restCode[st.Code()]
	if !ok { // codes.OK, or not a code at all
		rc = restCode[codes.Unknown]
	}
	if rc.http == http.StatusInternalServerError && a.natsDown() {
		rc = restCode[codes.Unavailable] // as fail decides
	}
	attrs := []any{"method", r.Method, "path", r.URL.Path, "status", rc.http, "err", err}
	if rc.http >= 500 && r.Context().Err() == nil {
		a.log.Warn("http request failed", attrs...)
	} else {
		a.log.Debug("http request failed", attrs...)
	}
	if rc.http == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if rc.http == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="jetorder"`)
	}
	body := restErrorBody{restErrorDetail{Code: rc.http, Status: rc.name, Message: st.Message()}}
	for _, d := range st.Proto().GetDetails() {
		if js, err := protojson.Marshal(d); err == nil { // a type this binary does not know is left out
			var out bytes.Buffer
			_ = json.Compact(&out, js)
			body.Error.Details = append(body.Error.Details, out.Bytes())
		}
	}
	a.writeJSON(w, rc.http, body)
}
