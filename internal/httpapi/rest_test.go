package httpapi_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/internal/schemaapi"
)

// The sidecar's gRPC server is what the REST routes call.
var _ httpapi.PubSub = (*pubsubapi.Server)(nil)

const restProject = "rest-project"

// restEnv is a nats-server, a broker, the Pub/Sub gRPC server over it
// (called directly, not over gRPC) and the HTTP API with its REST routes.
type restEnv struct {
	ps      *pubsubapi.Server
	schemas *schemaapi.Server
	b       *broker.Broker
	srv     *httptest.Server
}

func newRESTEnv(t *testing.T, cfg httpapi.Config) *restEnv {
	t.Helper()
	nc, b := newBroker(t)
	schemas := schemaapi.New(nc, 1, nil)
	allow, err := push.ParseAllowList(push.DefaultAllow)
	if err != nil {
		t.Fatal(err)
	}
	ps := pubsubapi.New(b, pubsubapi.Config{PullWait: 2 * time.Second, Schemas: schemas, PushAllow: allow})
	t.Cleanup(ps.Close)
	cfg.Broker, cfg.PubSub, cfg.Schemas = b, ps, schemas
	srv := httptest.NewServer(httpapi.New(cfg))
	t.Cleanup(srv.Close)
	return &restEnv{ps: ps, schemas: schemas, b: b, srv: srv}
}

type restResp struct {
	code   int
	header http.Header
	body   []byte
}

// restCall sends a request; a path without a leading '/' is relative to
// /v1/projects/rest-project/. A body that is not "" is sent as JSON.
func (e *restEnv) call(t *testing.T, method, path, body string) restResp {
	t.Helper()
	h := http.Header{}
	if body != "" {
		h.Set("Content-Type", "application/json")
	}
	return e.callWith(t, method, path, h, strings.NewReader(body))
}

func (e *restEnv) callWith(t *testing.T, method, path string, h http.Header, body io.Reader) restResp {
	t.Helper()
	if !strings.HasPrefix(path, "/") {
		path = "/v1/projects/" + restProject + "/" + path
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(req.Header, h)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return restResp{resp.StatusCode, resp.Header, b}
}

// ok sends a request that must answer 200 and decodes the answer into
// out with protobuf's JSON mapping, unknown fields refused.
func (e *restEnv) ok(t *testing.T, method, path, body string, out proto.Message) {
	t.Helper()
	r := e.call(t, method, path, body)
	if r.code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	if out == nil {
		if !json.Valid(r.body) {
			t.Fatalf("%s %s: answer %q is not JSON", method, path, r.body)
		}
		return
	}
	if err := protojson.Unmarshal(r.body, out); err != nil {
		t.Fatalf("%s %s: answer %s: %v", method, path, r.body, err)
	}
}

type restErr struct {
	Code    int               `json:"code"`
	Status  string            `json:"status"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

// fails sends a request that must fail with code and status, and returns
// the error message.
func (e *restEnv) fails(t *testing.T, method, path, body string, code int, st string) string {
	t.Helper()
	return restFails(t, e.call(t, method, path, body), method+" "+path, code, st).Message
}

func restFails(t *testing.T, r restResp, what string, code int, st string) restErr {
	t.Helper()
	var eb struct {
		Error restErr `json:"error"`
	}
	if err := json.Unmarshal(r.body, &eb); err != nil {
		t.Fatalf("%s: %d %q: not a JSON error: %v", what, r.code, r.body, err)
	}
	if r.code != code || eb.Error.Code != code || eb.Error.Status != st {
		t.Fatalf("%s: %d %s, want %d %s", what, r.code, r.body, code, st)
	}
	return eb.Error
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q, want it to contain %q", what, got, want)
	}
}

func topicName(id string) string { return "projects/" + restProject + "/topics/" + id }
func subName(id string) string   { return "projects/" + restProject + "/subscriptions/" + id }

func TestRESTTopics(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})

	var topic pb.Topic
	e.ok(t, "PUT", "topics/orders", `{"labels": {"team": "billing"}, "messageRetentionDuration": "3600s"}`, &topic)
	want := &pb.Topic{Name: topicName("orders"), Labels: map[string]string{"team": "billing"}, State: pb.Topic_ACTIVE,
		MessageRetentionDuration: topic.GetMessageRetentionDuration()}
	if !proto.Equal(&topic, want) || topic.GetMessageRetentionDuration().AsDuration() != time.Hour {
		t.Errorf("created %v, want %v", &topic, want)
	}
	// The name in the body may be there, if it is the URL's; proto names
	// are accepted as well as lowerCamelCase ones.
	e.ok(t, "PUT", "topics/orders-2", `{"name": "`+topicName("orders-2")+`", "message_retention_duration": "7200s"}`, nil)
	// An empty body is an empty topic.
	e.ok(t, "PUT", "topics/orders-3", "", nil)
	msg := e.fails(t, "PUT", "topics/orders", `{}`, 409, "ALREADY_EXISTS")
	_, gerr := e.ps.CreateTopic(t.Context(), &pb.Topic{Name: topicName("orders")})
	if msg != status.Convert(gerr).Message() {
		t.Errorf("409 %q, gRPC %q", msg, status.Convert(gerr).Message())
	}

	var got pb.Topic
	e.ok(t, "GET", "topics/orders", "", &got)
	if !proto.Equal(&got, &topic) {
		t.Errorf("GET %v, want %v", &got, &topic)
	}
	// Google's REST clients ask for enums as numbers.
	r := e.call(t, "GET", "topics/orders?%24alt=json%3Benum-encoding%3Dint", "")
	mustContain(t, "GET with $alt=json;enum-encoding=int", string(r.body), `"state":1`)
	r = e.call(t, "GET", "topics/orders?alt=json;enum-encoding=int&prettyPrint=false&$.xgafv=2", "")
	mustContain(t, "GET with a raw ';'", string(r.body), `"state":1`)
	r = e.call(t, "GET", "topics/orders?alt=json", "")
	mustContain(t, "GET with alt=json", string(r.body), `"state":"ACTIVE"`)
	e.fails(t, "GET", "topics/nope", "", 404, "NOT_FOUND")

	var updated pb.Topic
	e.ok(t, "PATCH", "topics/orders", `{"topic": {"labels": {"team": "sales"}}, "updateMask": "labels"}`, &updated)
	if updated.GetLabels()["team"] != "sales" || updated.GetName() != topicName("orders") {
		t.Errorf("updated %v", &updated)
	}
	mustContain(t, "PATCH without a mask", e.fails(t, "PATCH", "topics/orders", `{"topic": {"labels": {}}}`, 400, "INVALID_ARGUMENT"), "update_mask names no field")
	e.fails(t, "PATCH", "topics/nope", `{"topic": {"labels": {}}, "updateMask": "labels"}`, 404, "NOT_FOUND")

	var list pb.ListTopicsResponse
	e.ok(t, "GET", "topics", "", &list)
	var names []string
	for _, t := range list.GetTopics() {
		names = append(names, t.GetName())
	}
	if want := []string{topicName("orders"), topicName("orders-2"), topicName("orders-3")}; !slices.Equal(names, want) {
		t.Errorf("list %v, want %v", names, want)
	}
	var page1, page2 pb.ListTopicsResponse
	e.ok(t, "GET", "topics?pageSize=2", "", &page1)
	e.ok(t, "GET", "topics?page_size=2&pageToken="+page1.GetNextPageToken(), "", &page2)
	if len(page1.GetTopics()) != 2 || page1.GetNextPageToken() == "" || len(page2.GetTopics()) != 1 || page2.GetTopics()[0].GetName() != topicName("orders-3") {
		t.Errorf("pages %v / %v", &page1, &page2)
	}
	mustContain(t, "negative pageSize", e.fails(t, "GET", "topics?pageSize=-1", "", 400, "INVALID_ARGUMENT"), "page_size -1 is negative")
	mustContain(t, "pageSize not a number", e.fails(t, "GET", "topics?pageSize=ten", "", 400, "INVALID_ARGUMENT"), `query parameter "pageSize"`)
	var empty pb.ListTopicsResponse
	e.ok(t, "GET", "/v1/projects/other-project/topics", "", &empty)
	if len(empty.GetTopics()) != 0 {
		t.Errorf("another project's topics: %v", &empty)
	}

	e.ok(t, "PUT", "subscriptions/orders-sub", `{"topic": "`+topicName("orders")+`"}`, nil)
	var subs pb.ListTopicSubscriptionsResponse
	e.ok(t, "GET", "topics/orders/subscriptions", "", &subs)
	if !slices.Equal(subs.GetSubscriptions(), []string{subName("orders-sub")}) {
		t.Errorf("topic's subscriptions %v", subs.GetSubscriptions())
	}
	e.fails(t, "GET", "topics/nope/subscriptions", "", 404, "NOT_FOUND")
	// Not served by the gRPC server either.
	e.fails(t, "GET", "topics/orders/snapshots", "", 501, "UNIMPLEMENTED")

	r = e.call(t, "DELETE", "topics/orders", "")
	if r.code != 200 || strings.TrimSpace(string(r.body)) != "{}" {
		t.Errorf("DELETE: %d %s, want 200 {}", r.code, r.body)
	}
	e.fails(t, "DELETE", "topics/orders", "", 404, "NOT_FOUND")
	e.fails(t, "GET", "topics/orders", "", 404, "NOT_FOUND")
	var sub pb.Subscription
	e.ok(t, "GET", "subscriptions/orders-sub", "", &sub)
	if sub.GetTopic() != "_deleted-topic_" {
		t.Errorf("subscription of a deleted topic names %q", sub.GetTopic())
	}
}

func TestRESTSubscriptions(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	e.ok(t, "PUT", "topics/events", "", nil)

	var sub pb.Subscription
	e.ok(t, "PUT", "subscriptions/events-sub", `{"topic": "`+topicName("events")+`", "enableMessageOrdering": true, "ackDeadlineSeconds": 30, "labels": {"app": "web"}}`, &sub)
	grpc, err := e.ps.GetSubscription(t.Context(), &pb.GetSubscriptionRequest{Subscription: subName("events-sub")})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&sub, grpc) || !sub.GetEnableMessageOrdering() || sub.GetAckDeadlineSeconds() != 30 {
		t.Errorf("created %v, gRPC's GetSubscription %v", &sub, grpc)
	}
	e.fails(t, "PUT", "subscriptions/events-sub", `{"topic": "`+topicName("events")+`"}`, 409, "ALREADY_EXISTS")
	e.fails(t, "PUT", "subscriptions/orphan", `{"topic": "`+topicName("nope")+`"}`, 404, "NOT_FOUND")
	mustContain(t, "no topic", e.fails(t, "PUT", "subscriptions/orphan", `{}`, 400, "INVALID_ARGUMENT"), "invalid topic name")
	mustContain(t, "push", e.fails(t, "PUT", "subscriptions/pushy", `{"topic": "`+topicName("events")+`", "pushConfig": {"pushEndpoint": "https://example.com/push"}}`, 400, "INVALID_ARGUMENT"),
		"not allowed")

	var got pb.Subscription
	e.ok(t, "GET", "subscriptions/events-sub", "", &got)
	if !proto.Equal(&got, grpc) {
		t.Errorf("GET %v, want %v", &got, grpc)
	}
	e.fails(t, "GET", "subscriptions/nope", "", 404, "NOT_FOUND")

	var updated pb.Subscription
	e.ok(t, "PATCH", "subscriptions/events-sub", `{"subscription": {"ackDeadlineSeconds": 45}, "updateMask": "ackDeadlineSeconds"}`, &updated)
	if updated.GetAckDeadlineSeconds() != 45 {
		t.Errorf("updated %v", &updated)
	}
	// Fields by their proto names; the mask's paths in JSON are
	// lowerCamelCase, as proto3's JSON mapping of a FieldMask has them.
	e.ok(t, "PATCH", "subscriptions/events-sub", `{"subscription": {"ack_deadline_seconds": 50}, "update_mask": "ackDeadlineSeconds"}`, &updated)
	if updated.GetAckDeadlineSeconds() != 50 {
		t.Errorf("updated %v", &updated)
	}
	e.fails(t, "PATCH", "subscriptions/events-sub", `{"subscription": {"ackDeadlineSeconds": 9999}, "updateMask": "ackDeadlineSeconds"}`, 400, "INVALID_ARGUMENT")
	e.fails(t, "PATCH", "subscriptions/nope", `{"subscription": {"ackDeadlineSeconds": 20}, "updateMask": "ackDeadlineSeconds"}`, 404, "NOT_FOUND")

	e.ok(t, "PUT", "subscriptions/events-sub-2", `{"topic": "`+topicName("events")+`"}`, nil)
	var list pb.ListSubscriptionsResponse
	e.ok(t, "GET", "subscriptions?pageSize=1", "", &list)
	if len(list.GetSubscriptions()) != 1 || list.GetSubscriptions()[0].GetName() != subName("events-sub") || list.GetNextPageToken() == "" {
		t.Errorf("first page %v", &list)
	}
	e.ok(t, "GET", "subscriptions?pageToken="+list.GetNextPageToken(), "", &list)
	if len(list.GetSubscriptions()) != 1 || list.GetSubscriptions()[0].GetName() != subName("events-sub-2") || list.GetNextPageToken() != "" {
		t.Errorf("second page %v", &list)
	}

	e.ok(t, "DELETE", "subscriptions/events-sub-2", "", nil)
	e.fails(t, "DELETE", "subscriptions/events-sub-2", "", 404, "NOT_FOUND")
	// The didcomm route under a subscription is still there.
	mustContain(t, "didcomm thread", e.fails(t, "GET", "subscriptions/events-sub/didcomm/threads/t1", "", 404, "NOT_FOUND"), "does not track DIDComm threads")
}

// Publish, pull, acknowledge and modifyAckDeadline over REST, with the
// fields of Google's REST API.
func TestRESTPullAcknowledge(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	e.ok(t, "PUT", "topics/jobs", "", nil)
	e.ok(t, "PUT", "topics/jobs-dead", "", nil)
	e.ok(t, "PUT", "subscriptions/jobs-sub", `{"topic": "`+topicName("jobs")+`", "enableMessageOrdering": true, "ackDeadlineSeconds": 60,
		"deadLetterPolicy": {"deadLetterTopic": "`+topicName("jobs-dead")+`", "maxDeliveryAttempts": 5}}`, nil)

	var empty pb.PullResponse
	e.ok(t, "POST", "subscriptions/jobs-sub:pull", `{"returnImmediately": true, "maxMessages": 10}`, &empty)
	if len(empty.GetReceivedMessages()) != 0 {
		t.Fatalf("pull of an empty subscription: %v", &empty)
	}

	var pub pb.PublishResponse
	e.ok(t, "POST", "topics/jobs:publish", fmt.Sprintf(`{"topic": %q, "messages": [
		{"data": %q, "attributes": {"n": "1"}, "orderingKey": "job-7"},
		{"data": %q, "orderingKey": "job-7"},
		{"data": %q, "orderingKey": "job-7"}]}`, topicName("jobs"), b64("one"), b64("two"), b64("three")), &pub)
	if len(pub.GetMessageIds()) != 3 {
		t.Fatalf("publish: %v", &pub)
	}
	start := time.Now()

	pull := func() *pb.ReceivedMessage {
		t.Helper()
		var resp pb.PullResponse
		e.ok(t, "POST", "subscriptions/jobs-sub:pull", `{"maxMessages": 10}`, &resp)
		// One message of a key at a time: the next waits for the ack.
		if len(resp.GetReceivedMessages()) != 1 {
			t.Fatalf("pull: %d messages, want 1: %v", len(resp.GetReceivedMessages()), &resp)
		}
		return resp.GetReceivedMessages()[0]
	}
	first := pull()
	m := first.GetMessage()
	if first.GetAckId() == "" || first.GetDeliveryAttempt() != 1 || string(m.GetData()) != "one" || m.GetMessageId() != pub.GetMessageIds()[0] ||
		m.GetOrderingKey() != "job-7" || m.GetAttributes()["n"] != "1" || m.GetPublishTime().AsTime().Before(start.Add(-time.Minute)) {
		t.Errorf("first message %v", first)
	}
	// The wire form: data in base64, publishTime in RFC 3339.
	r := e.call(t, "POST", "subscriptions/jobs-sub:modifyAckDeadline", `{"ackIds": ["`+first.GetAckId()+`"], "ackDeadlineSeconds": 120}`)
	if r.code != 200 || strings.TrimSpace(string(r.body)) != "{}" {
		t.Fatalf("modifyAckDeadline: %d %s", r.code, r.body)
	}
	r = e.call(t, "POST", "subscriptions/jobs-sub:acknowledge", `{"ackIds": ["`+first.GetAckId()+`"]}`)
	if r.code != 200 || strings.TrimSpace(string(r.body)) != "{}" {
		t.Fatalf("acknowledge: %d %s", r.code, r.body)
	}

	second := pull()
	if string(second.GetMessage().GetData()) != "two" {
		t.Fatalf("second message %v", second)
	}
	// A nack: the same message comes back before the third.
	e.ok(t, "POST", "subscriptions/jobs-sub:modifyAckDeadline", `{"ackIds": ["`+second.GetAckId()+`"], "ackDeadlineSeconds": 0}`, nil)
	again := pull()
	if again.GetMessage().GetMessageId() != second.GetMessage().GetMessageId() || again.GetDeliveryAttempt() != 2 {
		t.Fatalf("after a nack %v, want %s again, attempt 2", again, second.GetMessage().GetMessageId())
	}
	e.ok(t, "POST", "subscriptions/jobs-sub:acknowledge", `{"ackIds": ["`+again.GetAckId()+`"]}`, nil)
	third := pull()
	if string(third.GetMessage().GetData()) != "three" {
		t.Fatalf("third message %v", third)
	}
	raw := e.call(t, "POST", "subscriptions/jobs-sub:modifyAckDeadline", `{"ackIds": ["`+third.GetAckId()+`"], "ackDeadlineSeconds": 0}`)
	if raw.code != 200 {
		t.Fatalf("nack: %d %s", raw.code, raw.body)
	}
	raw = e.call(t, "POST", "subscriptions/jobs-sub:pull", `{"max_messages": 1}`)
	var wire struct {
		ReceivedMessages []struct {
			AckID   string `json:"ackId"`
			Message struct {
				Data        string `json:"data"`
				MessageID   string `json:"messageId"`
				PublishTime string `json:"publishTime"`
				OrderingKey string `json:"orderingKey"`
			} `json:"message"`
			DeliveryAttempt int `json:"deliveryAttempt"`
		} `json:"receivedMessages"`
	}
	if err := json.Unmarshal(raw.body, &wire); err != nil || len(wire.ReceivedMessages) != 1 {
		t.Fatalf("pull: %d %s (%v)", raw.code, raw.body, err)
	}
	w := wire.ReceivedMessages[0]
	if _, err := time.Parse(time.RFC3339Nano, w.Message.PublishTime); err != nil || w.Message.Data != b64("three") ||
		w.Message.OrderingKey != "job-7" || w.DeliveryAttempt != 2 || w.AckID == "" {
		t.Errorf("pulled %s", raw.body)
	}
	e.ok(t, "POST", "subscriptions/jobs-sub:acknowledge", `{"ackIds": ["`+w.AckID+`"]}`, nil)
	// An ack id of another subscription: the gRPC server's refusal.
	msg := e.fails(t, "POST", "subscriptions/jobs-sub:acknowledge", `{"ackIds": ["not-an-ack-id"]}`, 400, "INVALID_ARGUMENT")
	mustContain(t, "bad ack id", msg, "invalid ack id")
	mustContain(t, "no maxMessages", e.fails(t, "POST", "subscriptions/jobs-sub:pull", `{}`, 400, "INVALID_ARGUMENT"), "max_messages must be positive")
	e.fails(t, "POST", "subscriptions/nope:pull", `{"maxMessages": 1}`, 404, "NOT_FOUND")
	e.fails(t, "POST", "subscriptions/jobs-sub:modifyAckDeadline", `{"ackIds": ["x"], "ackDeadlineSeconds": 601}`, 400, "INVALID_ARGUMENT")
}

func TestRESTSeekAndSnapshots(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	e.ok(t, "PUT", "topics/ledger", "", nil)
	e.ok(t, "PUT", "topics/other", "", nil)
	e.ok(t, "PUT", "subscriptions/ledger-sub", `{"topic": "`+topicName("ledger")+`", "enableMessageOrdering": true}`, nil)
	e.ok(t, "PUT", "subscriptions/other-sub", `{"topic": "`+topicName("other")+`"}`, nil)

	var snap pb.Snapshot
	e.ok(t, "PUT", "snapshots/before", `{"subscription": "`+subName("ledger-sub")+`", "labels": {"why": "test"}}`, &snap)
	if snap.GetName() != "projects/"+restProject+"/snapshots/before" || snap.GetTopic() != topicName("ledger") || snap.GetExpireTime() == nil {
		t.Errorf("created %v", &snap)
	}
	e.fails(t, "PUT", "snapshots/before", `{"subscription": "`+subName("ledger-sub")+`"}`, 409, "ALREADY_EXISTS")
	var got pb.Snapshot
	e.ok(t, "GET", "snapshots/before", "", &got)
	if !proto.Equal(&got, &snap) {
		t.Errorf("GET %v, want %v", &got, &snap)
	}
	var list pb.ListSnapshotsResponse
	e.ok(t, "GET", "snapshots", "", &list)
	if len(list.GetSnapshots()) != 1 || list.GetSnapshots()[0].GetName() != snap.GetName() {
		t.Errorf("list %v", &list)
	}
	e.ok(t, "PATCH", "snapshots/before", `{"snapshot": {"labels": {"why": "changed"}}, "updateMask": "labels"}`, &got)
	if got.GetLabels()["why"] != "changed" {
		t.Errorf("updated %v", &got)
	}

	var pub pb.PublishResponse
	e.ok(t, "POST", "topics/ledger:publish", fmt.Sprintf(`{"messages": [{"data": %q, "orderingKey": "k"}]}`, b64("entry")), &pub)
	pullOne := func() *pb.ReceivedMessage {
		t.Helper()
		var resp pb.PullResponse
		e.ok(t, "POST", "subscriptions/ledger-sub:pull", `{"maxMessages": 1}`, &resp)
		if len(resp.GetReceivedMessages()) != 1 {
			t.Fatalf("pull: %v", &resp)
		}
		return resp.GetReceivedMessages()[0]
	}
	m := pullOne()
	e.ok(t, "POST", "subscriptions/ledger-sub:acknowledge", `{"ackIds": ["`+m.GetAckId()+`"]}`, nil)

	// Back to the snapshot: the acked message is delivered again.
	r := e.call(t, "POST", "subscriptions/ledger-sub:seek", `{"snapshot": "`+snap.GetName()+`"}`)
	if r.code != 200 || strings.TrimSpace(string(r.body)) != "{}" {
		t.Fatalf("seek to the snapshot: %d %s", r.code, r.body)
	}
	if m2 := pullOne(); m2.GetMessage().GetMessageId() != pub.GetMessageIds()[0] {
		t.Fatalf("after the seek: %v", m2)
	} else {
		e.ok(t, "POST", "subscriptions/ledger-sub:acknowledge", `{"ackIds": ["`+m2.GetAckId()+`"]}`, nil)
	}
	// And to a time, in RFC 3339.
	e.ok(t, "POST", "subscriptions/ledger-sub:seek", `{"time": "2000-01-01T00:00:00Z"}`, nil)
	if m3 := pullOne(); m3.GetMessage().GetMessageId() != pub.GetMessageIds()[0] {
		t.Fatalf("after the seek to a time: %v", m3)
	}
	mustContain(t, "seek to nothing", e.fails(t, "POST", "subscriptions/ledger-sub:seek", `{}`, 400, "INVALID_ARGUMENT"), "set time or snapshot")
	e.fails(t, "POST", "subscriptions/ledger-sub:seek", `{"time": "yesterday"}`, 400, "INVALID_ARGUMENT")
	e.fails(t, "POST", "subscriptions/other-sub:seek", `{"snapshot": "`+snap.GetName()+`"}`, 400, "FAILED_PRECONDITION")
	e.fails(t, "POST", "subscriptions/ledger-sub:seek", `{"snapshot": "projects/`+restProject+`/snapshots/nope"}`, 404, "NOT_FOUND")

	e.ok(t, "DELETE", "snapshots/before", "", nil)
	e.fails(t, "GET", "snapshots/before", "", 404, "NOT_FOUND")
	e.fails(t, "DELETE", "snapshots/before", "", 404, "NOT_FOUND")
}

func TestRESTDetachAndPush(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	e.ok(t, "PUT", "topics/feed", "", nil)
	e.ok(t, "PUT", "subscriptions/feed-sub", `{"topic": "`+topicName("feed")+`"}`, nil)

	// Push: only to allowed endpoints (loopback here); a push
	// subscription cannot be pulled; an empty push config makes it a pull
	// subscription again.
	mustContain(t, "push elsewhere", e.fails(t, "POST", "subscriptions/feed-sub:modifyPushConfig",
		`{"pushConfig": {"pushEndpoint": "https://example.com/push"}}`, 400, "INVALID_ARGUMENT"), "not allowed")
	e.fails(t, "POST", "subscriptions/feed-sub:modifyPushConfig", `{}`, 400, "INVALID_ARGUMENT")
	e.fails(t, "POST", "subscriptions/nope:modifyPushConfig", `{"pushConfig": {}}`, 404, "NOT_FOUND")
	e.ok(t, "POST", "subscriptions/feed-sub:modifyPushConfig", `{"pushConfig": {"pushEndpoint": "http://127.0.0.1:9/push", "noWrapper": {"writeMetadata": true}}}`, nil)
	var pushed pb.Subscription
	e.ok(t, "GET", "subscriptions/feed-sub", "", &pushed)
	if pc := pushed.GetPushConfig(); pc.GetPushEndpoint() != "http://127.0.0.1:9/push" || !pc.GetNoWrapper().GetWriteMetadata() {
		t.Errorf("push config after :modifyPushConfig: %v", pc)
	}
	mustContain(t, "pull a push subscription", e.fails(t, "POST", "subscriptions/feed-sub:pull", `{"maxMessages": 1}`, 400, "FAILED_PRECONDITION"),
		"not supported for push subscriptions")
	e.ok(t, "POST", "subscriptions/feed-sub:modifyPushConfig", `{"pushConfig": {}}`, nil)
	e.ok(t, "GET", "subscriptions/feed-sub", "", &pushed)
	if pc := pushed.GetPushConfig(); pc.GetPushEndpoint() != "" || pc.GetWrapper() != nil {
		t.Errorf("push config after an empty :modifyPushConfig: %v", pc)
	}

	// :detach has no body.
	var resp pb.DetachSubscriptionResponse
	e.ok(t, "POST", "subscriptions/feed-sub:detach", "", &resp)
	var sub pb.Subscription
	e.ok(t, "GET", "subscriptions/feed-sub", "", &sub)
	if !sub.GetDetached() {
		t.Errorf("detached subscription %v", &sub)
	}
	e.fails(t, "POST", "subscriptions/feed-sub:pull", `{"maxMessages": 1}`, 400, "FAILED_PRECONDITION")
	e.fails(t, "POST", "subscriptions/nope:detach", "", 404, "NOT_FOUND")
	mustContain(t, "detach with a query", e.fails(t, "POST", "subscriptions/feed-sub:detach?force=true", "", 400, "INVALID_ARGUMENT"), `unknown query parameter "force"`)
}

// Refusals the REST layer decides: the request's shape, not the service.
func TestRESTRequestErrors(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{MaxBodyBytes: 4096})
	e.ok(t, "PUT", "topics/shapes", "", nil)
	e.ok(t, "PUT", "subscriptions/shapes-sub", `{"topic": "`+topicName("shapes")+`"}`, nil)
	jsonCT := http.Header{"Content-Type": {"application/json"}}

	tests := []struct {
		name, method, path, body string
		header                   http.Header // default: JSON when there is a body
		code                     int
		status, msg              string
	}{
		{name: "bad JSON", method: "PUT", path: "topics/bad-json", body: `{"labels": `,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "not an object", method: "PUT", path: "topics/bad-json", body: `["labels"]`,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "data after the object", method: "PUT", path: "topics/bad-json", body: `{} {}`,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "unknown field", method: "PUT", path: "topics/bad-json", body: `{"colour": "red"}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown field "colour"`},
		{name: "unknown nested field", method: "PATCH", path: "subscriptions/shapes-sub", body: `{"subscription": {"colour": "red"}, "updateMask": "labels"}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown field "colour"`},
		{name: "output-only field of another message", method: "POST", path: "subscriptions/shapes-sub:pull", body: `{"maxMessages": 1, "receivedMessages": []}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown field "receivedMessages"`},
		{name: "wrong type", method: "PUT", path: "topics/bad-json", body: `{"labels": ["a"]}`,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "wrong type in a verb's body", method: "POST", path: "subscriptions/shapes-sub:acknowledge", body: `{"ackIds": 7}`,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "not UTF-8", method: "PUT", path: "topics/bad-json", body: "{\"labels\": {\"a\": \"\xff\"}}",
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid UTF-8"},
		{name: "half a surrogate pair", method: "PUT", path: "topics/bad-json", body: `{"labels": {"a": "\ud800"}}`,
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid JSON: "},
		{name: "duplicate field", method: "PUT", path: "topics/bad-json", body: `{"labels": {}, "labels": {}}`,
			code: 400, status: "INVALID_ARGUMENT", msg: "duplicate field"},
		{name: "body names another topic", method: "PUT", path: "topics/mine", body: `{"name": "` + topicName("theirs") + `"}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `the body's name "projects/rest-project/topics/theirs" is not the resource of the URL, "projects/rest-project/topics/mine"`},
		{name: "patch body names another topic", method: "PATCH", path: "topics/shapes", body: `{"topic": {"name": "` + topicName("theirs") + `"}, "updateMask": "labels"}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `the body's topic.name "projects/rest-project/topics/theirs"`},
		{name: "pull body names another subscription", method: "POST", path: "subscriptions/shapes-sub:pull", body: `{"subscription": "` + subName("theirs") + `", "maxMessages": 1}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `the body's subscription`},
		{name: "publish body names another topic", method: "POST", path: "topics/shapes:publish", body: `{"topic": "` + topicName("theirs") + `", "messages": [{"data": "eA=="}]}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `the body's topic "projects/rest-project/topics/theirs" is not the topic of the URL`},
		{name: "text body", method: "PUT", path: "topics/bad-json", body: `{}`, header: http.Header{"Content-Type": {"text/plain"}},
			code: 415, status: "INVALID_ARGUMENT", msg: `Content-Type "text/plain" is not supported`},
		{name: "oversized body", method: "PUT", path: "topics/big", body: `{"labels": {"a": "` + strings.Repeat("b", 5000) + `"}}`,
			code: 413, status: "INVALID_ARGUMENT", msg: "request body of 5021 bytes exceeds the limit of 4096 bytes"},
		{name: "unknown query parameter", method: "GET", path: "topics?colour=red",
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown query parameter "colour": ListTopicsRequest has no such field`},
		{name: "query parameter the path gives", method: "GET", path: "topics?project=projects/x",
			code: 400, status: "INVALID_ARGUMENT", msg: `query parameter "project" is not allowed: the URL's path gives it`},
		{name: "query parameter twice", method: "GET", path: "topics?pageSize=1&pageSize=2",
			code: 400, status: "INVALID_ARGUMENT", msg: `query parameter "pageSize" is given 2 times`},
		{name: "query parameter on a body method", method: "POST", path: "subscriptions/shapes-sub:pull?maxMessages=1", body: `{}`,
			code: 400, status: "INVALID_ARGUMENT", msg: `query parameter "maxMessages" is not allowed: Pull takes its fields in the JSON body`},
		{name: "query parameter on GET", method: "GET", path: "topics/shapes?updateMask=labels",
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown query parameter "updateMask"`},
		{name: "bad query escape", method: "GET", path: "topics?pageToken=%zz",
			code: 400, status: "INVALID_ARGUMENT", msg: "invalid query string"},
		{name: "alt=proto", method: "GET", path: "topics?alt=proto",
			code: 400, status: "INVALID_ARGUMENT", msg: `alt="proto" is not supported`},
		{name: "alt with an unknown parameter", method: "GET", path: "topics?$alt=json%3Benum-encoding%3Dbits",
			code: 400, status: "INVALID_ARGUMENT", msg: `unknown parameter "enum-encoding=bits"`},
		{name: "POST on a topic", method: "POST", path: "topics/shapes", body: `{}`,
			code: 405, status: "UNIMPLEMENTED", msg: "method POST is not allowed"},
		{name: "POST on a subscription", method: "POST", path: "subscriptions/shapes-sub", body: `{}`,
			code: 405, status: "UNIMPLEMENTED", msg: "use PUT or GET or PATCH or DELETE"},
		{name: "DELETE on a list", method: "DELETE", path: "topics",
			code: 405, status: "UNIMPLEMENTED", msg: "method DELETE is not allowed"},
		{name: "GET on :pull", method: "GET", path: "subscriptions/shapes-sub:pull",
			code: 405, status: "UNIMPLEMENTED", msg: "use POST"},
		{name: "PUT on a topic's subscriptions", method: "PUT", path: "topics/shapes/subscriptions", body: `{}`,
			code: 405, status: "UNIMPLEMENTED", msg: "use GET"},
		{name: "unknown subscription method", method: "POST", path: "subscriptions/shapes-sub:frobnicate", body: `{}`,
			code: 404, status: "NOT_FOUND", msg: "subscription has no method :frobnicate (it has :acknowledge, :detach, :modifyAckDeadline, :modifyPushConfig, :pull, :seek)"},
		{name: "unknown topic method", method: "POST", path: "topics/shapes:frobnicate", body: `{}`,
			code: 404, status: "NOT_FOUND", msg: "a topic has the method :publish"},
		{name: "snapshot method", method: "POST", path: "snapshots/snap:seek", body: `{}`,
			code: 404, status: "NOT_FOUND", msg: "snapshot has no method :seek (it has none)"},
		{name: "unknown collection", method: "GET", path: "widgets",
			code: 404, status: "NOT_FOUND", msg: "no route for GET"},
		{name: "no REST under the default project", method: "GET", path: "/v1/topics/shapes",
			code: 404, status: "NOT_FOUND", msg: "no default project is configured"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.header
			if h == nil && tc.body != "" {
				h = jsonCT
			}
			r := e.callWith(t, tc.method, tc.path, h, strings.NewReader(tc.body))
			got := restFails(t, r, tc.method+" "+tc.path, tc.code, tc.status)
			mustContain(t, tc.name, got.Message, tc.msg)
			if tc.code == 405 && r.header.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
		})
	}
	// Nothing was created by a refused request.
	for _, id := range []string{"bad-json", "mine", "theirs", "big"} {
		e.fails(t, "GET", "topics/"+id, "", 404, "NOT_FOUND")
	}

	// A body over the limit as it streams in (chunked, no length).
	body := io.MultiReader(strings.NewReader(`{"labels": {"a": "`), strings.NewReader(strings.Repeat("b", 5000)+`"}}`))
	r := e.callWith(t, "PUT", "topics/big", jsonCT, struct{ io.Reader }{body})
	mustContain(t, "streamed", restFails(t, r, "streamed PUT", 413, "INVALID_ARGUMENT").Message, "request body exceeds the limit of 4096 bytes")
}

// Hostile resource names are refused with the gRPC server's own texts:
// the REST routes pass the name through.
func TestRESTHostileNames(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	ctx := t.Context()
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name    string
		segment string // as it goes in the path, escaped
		id      string // as the service gets it
	}{
		{"dot dot", "%2E%2E", ".."},
		{"dot", "%2E", "."},
		{"slash", "a%2Fbcd", "a/bcd"},
		{"slash dot dot", "..%2F..%2Fsecrets", "../../secrets"},
		{"too long", long, long},
		{"non-ASCII", "caf%C3%A9-orders", "café-orders"},
		{"NUL", "ord%00ers", "ord\x00ers"},
		{"NATS wildcards", "or.%2A.%3E", "or.*.>"},
		{"space", "my%20orders", "my orders"},
		{"reserved", "goog-orders", "goog-orders"},
		{"too short", "ab", "ab"},
		{"not UTF-8", "%FForders", "\xfforders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// check: the REST call answers as the gRPC call did.
			check := func(method, path, body string, err error) {
				t.Helper()
				if err == nil { // a project id may be what a topic id may not
					e.ok(t, method, path, body, nil)
					return
				}
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("gRPC: %v, want INVALID_ARGUMENT", err)
				}
				if got, want := e.fails(t, method, path, body, 400, "INVALID_ARGUMENT"), status.Convert(err).Message(); got != want {
					t.Errorf("%s %s: %q, gRPC %q", method, path, got, want)
				}
			}
			_, err := e.ps.CreateTopic(ctx, &pb.Topic{Name: topicName(tc.id)})
			check("PUT", "topics/"+tc.segment, `{}`, err)
			_, err = e.ps.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicName(tc.id)})
			check("GET", "topics/"+tc.segment, "", err)
			_, err = e.ps.ListTopicSubscriptions(ctx, &pb.ListTopicSubscriptionsRequest{Topic: topicName(tc.id)})
			check("GET", "topics/"+tc.segment+"/subscriptions", "", err)
			_, err = e.ps.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: subName(tc.id)})
			check("DELETE", "subscriptions/"+tc.segment, "", err)
			_, err = e.ps.Pull(ctx, &pb.PullRequest{Subscription: subName(tc.id), MaxMessages: 1})
			check("POST", "subscriptions/"+tc.segment+":pull", `{"maxMessages": 1}`, err)
			_, err = e.ps.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/" + tc.id})
			check("GET", "/v1/projects/"+tc.segment+"/topics", "", err)
		})
	}
	// The topic a subscription names in its body is checked as well.
	_, err := e.ps.CreateSubscription(ctx, &pb.Subscription{Name: subName("fine-sub"), Topic: topicName("../x")})
	if got := e.fails(t, "PUT", "subscriptions/fine-sub", `{"topic": "`+topicName("../x")+`"}`, 400, "INVALID_ARGUMENT"); got != status.Convert(err).Message() {
		t.Errorf("subscription of a hostile topic: %q, gRPC %q", got, status.Convert(err).Message())
	}
}

// :publish through the gRPC server's Publish: its schema checks, with the
// HTTP API's own checks and texts before them.
func TestRESTPublishThroughService(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{DefaultProject: restProject})
	if _, err := e.schemas.CreateSchema(t.Context(), &pb.CreateSchemaRequest{Parent: "projects/" + restProject, SchemaId: "order", Schema: &pb.Schema{
		Type: pb.Schema_AVRO, Definition: `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}`,
	}}); err != nil {
		t.Fatal(err)
	}
	e.ok(t, "PUT", "topics/typed", `{"schemaSettings": {"schema": "projects/`+restProject+`/schemas/order", "encoding": "JSON"}}`, nil)
	e.ok(t, "PUT", "subscriptions/typed-sub", `{"topic": "`+topicName("typed")+`"}`, nil)

	e.ok(t, "POST", "topics/typed:publish", fmt.Sprintf(`{"messages": [{"data": %q}]}`, b64(`{"id": 7}`)), nil)
	msg := e.fails(t, "POST", "topics/typed:publish", fmt.Sprintf(`{"messages": [{"data": %q}]}`, b64(`{"id": "seven"}`)), 400, "INVALID_ARGUMENT")
	mustContain(t, "schema refusal", msg, "Invalid data in message: Message failed schema validation.")
	// The default project's publish route goes the same way.
	e.fails(t, "POST", "/v1/topics/typed:publish", fmt.Sprintf(`{"messages": [{"data": %q}]}`, b64(`{}`)), 400, "INVALID_ARGUMENT")

	var resp pb.PullResponse
	e.ok(t, "POST", "subscriptions/typed-sub:pull", `{"maxMessages": 10}`, &resp)
	if len(resp.GetReceivedMessages()) != 1 {
		t.Fatalf("pulled %v, want the one valid message", &resp)
	}
	if a := resp.GetReceivedMessages()[0].GetMessage().GetAttributes(); a["googclient_schemaname"] != "projects/"+restProject+"/schemas/order" {
		t.Errorf("attributes %v: no googclient_schemaname", a)
	}

	// The HTTP API's own texts stay (httpapi_test.go's TestPublishErrors).
	e.ok(t, "PUT", "topics/plain", "", nil)
	for _, tc := range []struct{ body, msg string }{
		{`{"messages": []}`, "messages must not be empty"},
		{`{"messages": [{"data": "eA==", "orderingKey": ""}]}`, "Ordering key cannot be empty"},
		{`{"messages": [{"data": "eA==", "orderingKey": "\ud800"}]}`, `\ud800 is half of a UTF-16 surrogate pair`},
		{`{"messages": [{"data": "not base64!"}]}`, "messages[0].data is not base64"},
		{`{"messages": [{"orderingKey": "k"}]}`, "messages[0] is empty"},
		{`{"messages": [{"data": "eA==", "attributes": {"googleish": "x"}}]}`, `messages[0]: invalid message: attribute key "googleish": the prefix "goog" is reserved`},
		{``, "request body is empty"},
	} {
		mustContain(t, tc.body, e.fails(t, "POST", "topics/plain:publish", tc.body, 400, "INVALID_ARGUMENT"), tc.msg)
	}
	mustContain(t, "unknown topic", e.fails(t, "POST", "topics/no-such-topic:publish", `{"messages": [{"data": "eA=="}]}`, 404, "NOT_FOUND"), "topic not found")
	mustContain(t, "bad topic id", e.fails(t, "POST", "topics/ab:publish", `{"messages": [{"data": "eA=="}]}`, 400, "INVALID_ARGUMENT"), `invalid topic id "ab"`)
}

// Without Config.PubSub only publish is served, through the broker.
func TestRESTNotConfigured(t *testing.T) {
	_, b := newBroker(t)
	c, err := b.Client(restProject)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTopic(t.Context(), "plain"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Broker: b}))
	t.Cleanup(srv.Close)
	e := &restEnv{srv: srv}
	for _, tc := range []struct{ method, path string }{
		{"GET", "topics/plain"},
		{"PUT", "topics/other"},
		{"GET", "topics"},
		{"GET", "topics/plain/subscriptions"},
		{"GET", "subscriptions/plain-sub"},
		{"POST", "subscriptions/plain-sub:pull"},
		{"GET", "snapshots"},
	} {
		e.fails(t, tc.method, tc.path, "", 404, "NOT_FOUND")
	}
	e.ok(t, "POST", "topics/plain:publish", `{"topic": "`+topicName("plain")+`", "messages": [{"data": "eA=="}]}`, nil)
}

// fakePubSub answers GetTopic and Publish with err.
type fakePubSub struct {
	pb.UnimplementedPublisherServer
	pb.UnimplementedSubscriberServer
	err error
}

func (f *fakePubSub) GetTopic(context.Context, *pb.GetTopicRequest) (*pb.Topic, error) {
	return nil, f.err
}

func (f *fakePubSub) Publish(context.Context, *pb.PublishRequest) (*pb.PublishResponse, error) {
	return nil, f.err
}

// Every gRPC code as Google's REST API answers it, with its details.
func TestRESTErrorMapping(t *testing.T) {
	_, b := newBroker(t)
	fake := &fakePubSub{}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Broker: b, PubSub: fake}))
	t.Cleanup(srv.Close)
	e := &restEnv{srv: srv}

	for _, tc := range []struct {
		code codes.Code
		http int
		name string
	}{
		{codes.Canceled, 499, "CANCELLED"},
		{codes.Unknown, 500, "UNKNOWN"},
		{codes.InvalidArgument, 400, "INVALID_ARGUMENT"},
		{codes.DeadlineExceeded, 504, "DEADLINE_EXCEEDED"},
		{codes.NotFound, 404, "NOT_FOUND"},
		{codes.AlreadyExists, 409, "ALREADY_EXISTS"},
		{codes.PermissionDenied, 403, "PERMISSION_DENIED"},
		{codes.ResourceExhausted, 429, "RESOURCE_EXHAUSTED"},
		{codes.FailedPrecondition, 400, "FAILED_PRECONDITION"},
		{codes.Aborted, 409, "ABORTED"},
		{codes.OutOfRange, 400, "OUT_OF_RANGE"},
		{codes.Unimplemented, 501, "UNIMPLEMENTED"},
		{codes.Internal, 500, "INTERNAL"},
		{codes.Unavailable, 503, "UNAVAILABLE"},
		{codes.DataLoss, 500, "DATA_LOSS"},
		{codes.Unauthenticated, 401, "UNAUTHENTICATED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.err = status.Error(tc.code, "it went "+tc.name)
			r := e.call(t, "GET", "topics/any-topic", "")
			got := restFails(t, r, tc.name, tc.http, tc.name)
			if got.Message != "it went "+tc.name {
				t.Errorf("message %q", got.Message)
			}
			if ra := r.header.Get("Retry-After"); (tc.http == 503) != (ra == "1") {
				t.Errorf("Retry-After %q", ra)
			}
		})
	}

	st, err := status.New(codes.InvalidArgument, "some acks failed").WithDetails(&errdetails.ErrorInfo{
		Reason: "EXACTLY_ONCE_ACKID_FAILURE", Domain: "pubsub.googleapis.com", Metadata: map[string]string{"ack-1": "PERMANENT_FAILURE_INVALID_ACK_ID"},
	})
	if err != nil {
		t.Fatal(err)
	}
	fake.err = st.Err()
	got := restFails(t, e.call(t, "GET", "topics/any-topic", ""), "with details", 400, "INVALID_ARGUMENT")
	if len(got.Details) != 1 {
		t.Fatalf("details %s", got.Details)
	}
	var info struct {
		Type     string            `json:"@type"`
		Reason   string            `json:"reason"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(got.Details[0], &info); err != nil || info.Type != "type.googleapis.com/google.rpc.ErrorInfo" ||
		info.Reason != "EXACTLY_ONCE_ACKID_FAILURE" || info.Metadata["ack-1"] != "PERMANENT_FAILURE_INVALID_ACK_ID" {
		t.Errorf("detail %s (%v)", got.Details[0], err)
	}

	// Errors that are not statuses are answered as the publish routes
	// answer them.
	fake.err = fmt.Errorf("looking: %w", adapter.ErrTopicNotFound)
	e.fails(t, "GET", "topics/any-topic", "", 404, "NOT_FOUND")
	fake.err = errors.New("something odd")
	e.fails(t, "GET", "topics/any-topic", "", 500, "INTERNAL")

	// A publish whose time ran out is 503, as docs/HTTP.md says of the
	// publish routes, not 504.
	fake.err = status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	r := e.call(t, "POST", "topics/any-topic:publish", `{"messages": [{"data": "eA=="}]}`)
	restFails(t, r, "publish timing out", 503, "UNAVAILABLE")
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("publish timing out: Retry-After %q", r.header.Get("Retry-After"))
	}
	fake.err = status.Error(codes.NotFound, "Schema associated with topic deleted.")
	e.fails(t, "POST", "topics/any-topic:publish", `{"messages": [{"data": "eA=="}]}`, 404, "NOT_FOUND")
}

func TestRESTBase64(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	e.ok(t, "PUT", "topics/bytes", "", nil)
	e.ok(t, "PUT", "subscriptions/bytes-sub", `{"topic": "`+topicName("bytes")+`"}`, nil)
	data := []byte{0xfb, 0xff, 0x00, '>'}
	e.ok(t, "POST", "topics/bytes:publish", `{"messages": [{"data": "`+base64.RawURLEncoding.EncodeToString(data)+`"}]}`, nil)
	r := e.call(t, "POST", "subscriptions/bytes-sub:pull", `{"maxMessages": 1}`)
	// Google's REST API answers bytes in standard base64, padded.
	mustContain(t, "pulled data", string(r.body), `"data":"`+base64.StdEncoding.EncodeToString(data)+`"`)
}

// The SchemaService's REST routes, as google/pubsub/v1/schema.proto's
// rules map them (gcloud's pubsub schemas commands use them).
func TestRESTSchemas(t *testing.T) {
	e := newRESTEnv(t, httpapi.Config{})
	const v1 = `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}`
	const v2 = `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}, {"name": "note", "type": "string", "default": ""}]}`
	schemaName := "projects/" + restProject + "/schemas/orders"
	body := func(def string) string {
		b, err := json.Marshal(map[string]string{"type": "AVRO", "definition": def})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	var created pb.Schema
	e.ok(t, "POST", "schemas?schemaId=orders", body(v1), &created)
	if created.GetName() != schemaName || created.GetDefinition() != v1 || created.GetRevisionId() == "" {
		t.Errorf("created %v", &created)
	}
	e.fails(t, "POST", "schemas?schemaId=orders", body(v1), 409, "ALREADY_EXISTS")
	mustContain(t, "a body field in the query", e.fails(t, "POST", "schemas?schemaId=x&schema.type=AVRO", body(v1), 400, "INVALID_ARGUMENT"), `query parameter "schema.type" is not allowed`)

	var got pb.Schema
	e.ok(t, "GET", "schemas/orders", "", &got)
	if !proto.Equal(&got, &created) {
		t.Errorf("GET %v, want %v", &got, &created)
	}
	e.fails(t, "GET", "schemas/nope", "", 404, "NOT_FOUND")
	var list pb.ListSchemasResponse
	e.ok(t, "GET", "schemas", "", &list)
	if len(list.GetSchemas()) != 1 || list.GetSchemas()[0].GetName() != schemaName {
		t.Errorf("list %v", &list)
	}

	var committed pb.Schema
	e.ok(t, "POST", "schemas/orders:commit", `{"schema": `+body(v2)+`}`, &committed)
	if committed.GetDefinition() != v2 || committed.GetRevisionId() == created.GetRevisionId() {
		t.Errorf("committed %v", &committed)
	}
	var revs pb.ListSchemaRevisionsResponse
	e.ok(t, "GET", "schemas/orders:listRevisions", "", &revs)
	if len(revs.GetSchemas()) != 2 {
		t.Errorf("revisions %v", &revs)
	}
	e.fails(t, "POST", "schemas/orders:listRevisions", "", 405, "UNIMPLEMENTED")
	var rolled pb.Schema
	e.ok(t, "POST", "schemas/orders:rollback", `{"revisionId": "`+created.GetRevisionId()+`"}`, &rolled)
	if rolled.GetDefinition() != v1 {
		t.Errorf("rolled back to %v", &rolled)
	}
	e.ok(t, "DELETE", "schemas/orders:deleteRevision?revisionId="+committed.GetRevisionId(), "", nil)
	e.ok(t, "GET", "schemas/orders:listRevisions", "", &revs)
	if len(revs.GetSchemas()) != 2 { // the first and its rollback copy
		t.Errorf("revisions after deleting one: %v", &revs)
	}

	e.ok(t, "POST", "schemas:validate", `{"schema": `+body(v1)+`}`, nil)
	e.fails(t, "POST", "schemas:validate", `{"schema": {"type": "AVRO", "definition": "{"}}`, 400, "INVALID_ARGUMENT")
	e.ok(t, "POST", "schemas:validateMessage", `{"name": "`+schemaName+`", "message": "eyJpZCI6IDF9", "encoding": "JSON"}`, nil)
	e.fails(t, "POST", "schemas:validateMessage", `{"name": "`+schemaName+`", "message": "eyJpZCI6ICJ4In0=", "encoding": "JSON"}`, 400, "INVALID_ARGUMENT")
	e.fails(t, "GET", "schemas:validate", "", 405, "UNIMPLEMENTED")
	mustContain(t, "an unknown verb", e.fails(t, "POST", "schemas/orders:nope", "", 404, "NOT_FOUND"), "it has :commit, :deleteRevision, :listRevisions, :rollback")
	mustContain(t, "PATCH of a schema", e.fails(t, "PATCH", "schemas/orders", "{}", 405, "UNIMPLEMENTED"), "use GET or DELETE")

	e.ok(t, "DELETE", "schemas/orders", "", nil)
	e.fails(t, "GET", "schemas/orders", "", 404, "NOT_FOUND")
}
