package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// restSide is one way of talking to the sidecar: the REST API by hand,
// Google's Go client over gRPC, or Google's generated REST client. Each
// call returns the response as protobuf's JSON mapping decoded into Go
// values, or the error as {"status": NAME, "message": TEXT}.
type restSide interface {
	createTopic(t *testing.T, topic *pb.Topic) any
	getTopic(t *testing.T, name string) any
	createSubscription(t *testing.T, sub *pb.Subscription) any
	getSubscription(t *testing.T, name string) any
	publish(t *testing.T, req *pb.PublishRequest) any
	pull(t *testing.T, req *pb.PullRequest) any
	acknowledge(t *testing.T, req *pb.AcknowledgeRequest) any
	listTopicSubscriptions(t *testing.T, topic string) any
	deleteSubscription(t *testing.T, name string) any
	deleteTopic(t *testing.T, name string) any
}

// A REST round trip equals the gRPC one: the same steps (create a topic
// and an ordered subscription, publish three messages of a key, pull and
// acknowledge them one by one, list, fail, delete) through the REST API by
// hand, through Google's Go client over gRPC and through Google's
// generated REST client (cloud.google.com/go/pubsub/v2/apiv1, REST
// transport) give the same answers field by field, ids and times aside.
func TestRESTRoundTripEqualsGRPC(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	ctx := context.Background()
	endpoint := option.WithEndpoint("http://" + sc.HTTP)
	topicREST, err := vkit.NewTopicAdminRESTClient(ctx, endpoint, option.WithoutAuthentication(), option.WithTelemetryDisabled())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = topicREST.Close() })
	subREST, err := vkit.NewSubscriptionAdminRESTClient(ctx, endpoint, option.WithoutAuthentication(), option.WithTelemetryDisabled())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = subREST.Close() })

	sides := []struct {
		name string
		side restSide
	}{
		{"grpc", grpcSide{c.TopicAdminClient, c.SubscriptionAdminClient}},
		{"rest", &httpSide{base: "http://" + sc.HTTP}},
		{"restclient", grpcSide{topicREST, subREST}},
	}
	results := make([][]restStep, len(sides))
	for i, s := range sides {
		results[i] = restRoundTrip(t, s.name, s.side)
	}
	for i := 1; i < len(sides); i++ {
		if len(results[i]) != len(results[0]) {
			t.Fatalf("%s took %d steps, %s %d", sides[i].name, len(results[i]), sides[0].name, len(results[0]))
		}
		for j, step := range results[i] {
			want := results[0][j]
			if diffs := restDiff("", want.got, step.got); len(diffs) > 0 {
				t.Errorf("%s: %s differs from %s:\n  %s\n  %s: %s\n  %s: %s", step.name, sides[i].name, sides[0].name,
					strings.Join(diffs, "\n  "), sides[0].name, restJSON(want.got), sides[i].name, restJSON(step.got))
			}
		}
	}
	if t.Failed() {
		return
	}
	for _, step := range results[0] {
		t.Logf("%s: %s", step.name, restJSON(step.got))
	}
}

type restStep struct {
	name string
	got  any
}

// restRoundTrip runs the steps through side, on resources whose ids end
// in -{name}, and returns each answer with that suffix turned into -SIDE
// and the ids and times that differ by nature left out.
func restRoundTrip(t *testing.T, name string, side restSide) []restStep {
	t.Helper()
	topicID, subID := "roundtrip-"+name, "roundtrip-sub-"+name
	var steps []restStep
	record := func(step string, got any) any {
		steps = append(steps, restStep{step, restNormalize(got, "-"+name)})
		return got
	}
	record("create topic", side.createTopic(t, &pb.Topic{Name: topicPath(topicID), Labels: map[string]string{"team": "billing"}}))
	record("create topic again", side.createTopic(t, &pb.Topic{Name: topicPath(topicID)}))
	record("get topic", side.getTopic(t, topicPath(topicID)))
	record("get missing topic", side.getTopic(t, topicPath("missing-"+name)))
	record("create subscription", side.createSubscription(t, &pb.Subscription{
		Name: subPath(subID), Topic: topicPath(topicID), EnableMessageOrdering: true, AckDeadlineSeconds: 30,
	}))
	record("get subscription", side.getSubscription(t, subPath(subID)))
	// A space is escaped by every REST client; a '/' is not, so a name
	// with one is another path (404), not an invalid name.
	record("invalid subscription", side.getSubscription(t, subPath("bad sub-"+name)))
	record("publish", side.publish(t, &pb.PublishRequest{Topic: topicPath(topicID), Messages: []*pb.PubsubMessage{
		{Data: []byte("created"), Attributes: map[string]string{"step": "1"}, OrderingKey: "user-1"},
		{Data: []byte("paid"), Attributes: map[string]string{"step": "2"}, OrderingKey: "user-1"},
		{Data: []byte{0, 0xff, '>', '?'}, OrderingKey: "user-1"},
	}}))
	// One message of the key at a time: each pull gets the next once the
	// previous is acked. An empty pull (the wait ran out) is not a step.
	for i := range 3 {
		var got map[string]any
		deadline := time.Now().Add(30 * time.Second)
		for got == nil {
			resp, _ := side.pull(t, &pb.PullRequest{Subscription: subPath(subID), MaxMessages: 10}).(map[string]any)
			if _, ok := resp["receivedMessages"]; ok || resp["status"] != nil {
				got = resp
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: no message %d within 30s", name, i)
			}
		}
		record(fmt.Sprintf("pull %d", i), got)
		msgs, _ := got["receivedMessages"].([]any)
		if len(msgs) != 1 {
			t.Fatalf("%s: pull %d: %s, want one message", name, i, restJSON(got))
		}
		ackID, _ := msgs[0].(map[string]any)["ackId"].(string)
		record(fmt.Sprintf("acknowledge %d", i), side.acknowledge(t, &pb.AcknowledgeRequest{Subscription: subPath(subID), AckIds: []string{ackID}}))
	}
	record("pull of nothing", side.pull(t, &pb.PullRequest{Subscription: subPath(subID), MaxMessages: 10, ReturnImmediately: true}))
	record("pull without maxMessages", side.pull(t, &pb.PullRequest{Subscription: subPath(subID)}))
	record("list topic subscriptions", side.listTopicSubscriptions(t, topicPath(topicID)))
	record("delete subscription", side.deleteSubscription(t, subPath(subID)))
	record("delete topic", side.deleteTopic(t, topicPath(topicID)))
	record("delete topic again", side.deleteTopic(t, topicPath(topicID)))
	return steps
}

// restNormalize turns got into what every side answers alike: suffix
// replaced by -SIDE in every string, ids and times (which differ by
// nature) replaced by their kind.
func restNormalize(got any, suffix string) any {
	switch v := got.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			switch k {
			case "ackId", "messageId", "publishTime":
				out[k] = "<" + k + ">"
			case "messageIds":
				out[k] = fmt.Sprintf("<%d ids>", len(x.([]any)))
			default:
				out[k] = restNormalize(x, suffix)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = restNormalize(x, suffix)
		}
		return out
	case string:
		return strings.ReplaceAll(v, suffix, "-SIDE")
	}
	return got
}

// restDiff lists where a and b differ, field by field.
func restDiff(path string, a, b any) []string {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		var diffs []string
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range keys {
				if !yield(k) {
					return
				}
			}
		}) {
			diffs = append(diffs, restDiff(path+"."+k, am[k], bm[k])...)
		}
		return diffs
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok && len(al) == len(bl) {
		var diffs []string
		for i := range al {
			diffs = append(diffs, restDiff(fmt.Sprintf("%s[%d]", path, i), al[i], bl[i])...)
		}
		return diffs
	}
	if !reflect.DeepEqual(a, b) {
		return []string{fmt.Sprintf("%s: %s vs %s", path, restJSON(a), restJSON(b))}
	}
	return nil
}

func restJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// protoValue is m in protobuf's JSON mapping, decoded into Go values.
func protoValue(t *testing.T, m proto.Message) any {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// grpcSide calls Google's generated clients: over gRPC, or over REST when
// made by New*RESTClient.
type grpcSide struct {
	topics *vkit.TopicAdminClient
	subs   *vkit.SubscriptionAdminClient
}

func (g grpcSide) answer(t *testing.T, m proto.Message, err error) any {
	t.Helper()
	if err == nil {
		return protoValue(t, m)
	}
	// The REST transport's errors carry Google's REST error body.
	var herr *googleapi.Error
	if errors.As(err, &herr) {
		var eb struct {
			Error struct {
				Status  string `json:"status"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if jerr := json.Unmarshal([]byte(herr.Body), &eb); jerr != nil {
			t.Fatalf("REST client error %v: body %q: %v", err, herr.Body, jerr)
		}
		return map[string]any{"status": eb.Error.Status, "message": eb.Error.Message}
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	return map[string]any{"status": rpccode.Code(st.Code()).String(), "message": st.Message()}
}

func (g grpcSide) createTopic(t *testing.T, topic *pb.Topic) any {
	got, err := g.topics.CreateTopic(context.Background(), topic)
	return g.answer(t, got, err)
}

func (g grpcSide) getTopic(t *testing.T, name string) any {
	got, err := g.topics.GetTopic(context.Background(), &pb.GetTopicRequest{Topic: name})
	return g.answer(t, got, err)
}

func (g grpcSide) createSubscription(t *testing.T, sub *pb.Subscription) any {
	got, err := g.subs.CreateSubscription(context.Background(), sub)
	return g.answer(t, got, err)
}

func (g grpcSide) getSubscription(t *testing.T, name string) any {
	got, err := g.subs.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: name})
	return g.answer(t, got, err)
}

func (g grpcSide) publish(t *testing.T, req *pb.PublishRequest) any {
	got, err := g.topics.Publish(context.Background(), req)
	return g.answer(t, got, err)
}

func (g grpcSide) pull(t *testing.T, req *pb.PullRequest) any {
	got, err := g.subs.Pull(context.Background(), req)
	return g.answer(t, got, err)
}

func (g grpcSide) acknowledge(t *testing.T, req *pb.AcknowledgeRequest) any {
	return g.answer(t, &emptypb.Empty{}, g.subs.Acknowledge(context.Background(), req))
}

func (g grpcSide) listTopicSubscriptions(t *testing.T, topic string) any {
	it := g.topics.ListTopicSubscriptions(context.Background(), &pb.ListTopicSubscriptionsRequest{Topic: topic})
	var names []string
	for {
		name, err := it.Next()
		if err != nil {
			if !errors.Is(err, iterator.Done) {
				return g.answer(t, nil, err)
			}
			break
		}
		names = append(names, name)
	}
	return protoValue(t, &pb.ListTopicSubscriptionsResponse{Subscriptions: names})
}

func (g grpcSide) deleteSubscription(t *testing.T, name string) any {
	return g.answer(t, &emptypb.Empty{}, g.subs.DeleteSubscription(context.Background(), &pb.DeleteSubscriptionRequest{Subscription: name}))
}

func (g grpcSide) deleteTopic(t *testing.T, name string) any {
	return g.answer(t, &emptypb.Empty{}, g.topics.DeleteTopic(context.Background(), &pb.DeleteTopicRequest{Topic: name}))
}

// httpSide writes the REST requests by hand, in Google's URL shapes: the
// name from the path, the rest in a JSON body.
type httpSide struct{ base string }

func (h *httpSide) do(t *testing.T, method, name, body string) any {
	t.Helper()
	req, err := http.NewRequest(method, h.base+"/v1/"+name, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s %s: %d %q: %v", method, name, resp.StatusCode, b, err)
	}
	if resp.StatusCode != http.StatusOK {
		e, _ := v.(map[string]any)["error"].(map[string]any)
		if code, _ := e["code"].(float64); int(code) != resp.StatusCode {
			t.Fatalf("%s %s: %d %s: not Google's error shape", method, name, resp.StatusCode, b)
		}
		return map[string]any{"status": e["status"], "message": e["message"]}
	}
	return v
}

// body is m in JSON without the field the path gives (as Google's HTTP
// rules leave it out).
func restBody(t *testing.T, m proto.Message, pathField string) string {
	t.Helper()
	m = proto.Clone(m)
	m.ProtoReflect().Clear(m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(pathField)))
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = json.Compact(&out, b)
	return out.String()
}

func (h *httpSide) createTopic(t *testing.T, topic *pb.Topic) any {
	return h.do(t, "PUT", topic.GetName(), restBody(t, topic, "name"))
}

func (h *httpSide) getTopic(t *testing.T, name string) any { return h.do(t, "GET", name, "") }

func (h *httpSide) createSubscription(t *testing.T, sub *pb.Subscription) any {
	return h.do(t, "PUT", sub.GetName(), restBody(t, sub, "name"))
}

func (h *httpSide) getSubscription(t *testing.T, name string) any {
	// The subscription id is one path segment, escaped.
	prefix, id, _ := strings.Cut(name, "/subscriptions/")
	return h.do(t, "GET", prefix+"/subscriptions/"+url.PathEscape(id), "")
}

func (h *httpSide) publish(t *testing.T, req *pb.PublishRequest) any {
	return h.do(t, "POST", req.GetTopic()+":publish", restBody(t, req, "topic"))
}

func (h *httpSide) pull(t *testing.T, req *pb.PullRequest) any {
	return h.do(t, "POST", req.GetSubscription()+":pull", restBody(t, req, "subscription"))
}

func (h *httpSide) acknowledge(t *testing.T, req *pb.AcknowledgeRequest) any {
	return h.do(t, "POST", req.GetSubscription()+":acknowledge", restBody(t, req, "subscription"))
}

func (h *httpSide) listTopicSubscriptions(t *testing.T, topic string) any {
	return h.do(t, "GET", topic+"/subscriptions", "")
}

func (h *httpSide) deleteSubscription(t *testing.T, name string) any {
	return h.do(t, "DELETE", name, "")
}

func (h *httpSide) deleteTopic(t *testing.T, name string) any { return h.do(t, "DELETE", name, "") }

// Every resource the REST API lists in the order the gRPC API lists it.
func TestRESTListsEqualGRPC(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	h := &httpSide{base: "http://" + sc.HTTP}
	for _, id := range []string{"list-c", "list-a", "list-b"} {
		mustCreateTopic(t, c, id)
		mustCreateSub(t, c, &pb.Subscription{Name: subPath(id + "-sub"), Topic: topicPath(id)})
	}
	var grpcTopics []any
	it := c.TopicAdminClient.ListTopics(context.Background(), &pb.ListTopicsRequest{Project: "projects/" + project})
	for {
		tp, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		grpcTopics = append(grpcTopics, protoValue(t, tp))
	}
	rest := h.do(t, "GET", "projects/"+project+"/topics", "").(map[string]any)
	if !reflect.DeepEqual(rest["topics"], grpcTopics) {
		t.Errorf("topics: REST %s, gRPC %s", restJSON(rest["topics"]), restJSON(grpcTopics))
	}
	var grpcSubs []any
	sit := c.SubscriptionAdminClient.ListSubscriptions(context.Background(), &pb.ListSubscriptionsRequest{Project: "projects/" + project})
	for {
		s, err := sit.Next()
		if errors.Is(err, iterator.Done) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		grpcSubs = append(grpcSubs, protoValue(t, s))
	}
	rest = h.do(t, "GET", "projects/"+project+"/subscriptions?pageSize=100", "").(map[string]any)
	if !reflect.DeepEqual(rest["subscriptions"], grpcSubs) || len(grpcSubs) != 3 {
		t.Errorf("subscriptions: REST %s, gRPC %s", restJSON(rest["subscriptions"]), restJSON(grpcSubs))
	}
	names := func(v any) []string {
		var out []string
		for _, x := range v.([]any) {
			out = append(out, x.(map[string]any)["name"].(string))
		}
		return out
	}
	if got := names(rest["subscriptions"]); !sort.StringsAreSorted(got) {
		t.Errorf("subscriptions not sorted: %v", got)
	}
}
