package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// resourcesYAML declares one of each kind of resource, in itest.Project.
const resourcesYAML = `
projects:
  test-project:
    schemas:
      order:
        type: AVRO
        definition: '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}]}'
    topics:
      orders:
        labels: {team: checkout}
        messageRetentionDuration: 24h
      validated:
        schemaSettings: {schema: order, encoding: JSON}
      dead: {}
    subscriptions:
      orders-ordered:
        topic: orders
        enableMessageOrdering: true
        ackDeadlineSeconds: 20
        labels: {jetorder-ordering: strict}
        deadLetterPolicy: {deadLetterTopic: dead, maxDeliveryAttempts: 10}
        retryPolicy: {minimumBackoff: 1s}
      orders-filtered:
        topic: orders
        filter: attributes.region = "eu"
        enableExactlyOnceDelivery: true
        expirationPolicy: {ttl: 48h}
        messageRetentionDuration: 1h
`

// writeFile writes content to path, failing the test on an error.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lineOf is the line (from 1) of the first line of content holding s.
func lineOf(t *testing.T, content, s string) int {
	t.Helper()
	for i, l := range strings.Split(content, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no line holds %q", s)
	return 0
}

// declared reads the declared resources of resourcesYAML through Google's
// Go client (v2), by name.
func declared(t *testing.T, c *pubsub.Client) map[string]proto.Message {
	t.Helper()
	ctx := context.Background()
	out := map[string]proto.Message{}
	for _, id := range []string{"orders", "validated", "dead"} {
		tp, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath(id)})
		if err != nil {
			t.Fatalf("GetTopic %s: %v", id, err)
		}
		out[tp.GetName()] = tp
	}
	for _, id := range []string{"orders-ordered", "orders-filtered"} {
		s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(id)})
		if err != nil {
			t.Fatalf("GetSubscription %s: %v", id, err)
		}
		out[s.GetName()] = s
	}
	return out
}

// unquoted is a text log with the quotes in its values unescaped.
func unquoted(log string) string { return strings.ReplaceAll(log, `\"`, `"`) }

// The sidecar binary started with --resources has the declared topics,
// subscriptions and schemas before it serves, as Google's clients (v2 and
// v1) read them; the ordered one delivers in order. Started again with
// the same file it changes nothing; with a field changed that an update
// can change, it updates just that; with one that no update can change,
// or a file that is not valid, it does not start (exit 1 and 2), says
// which line and why, and changes nothing.
func TestResourcesFile(t *testing.T) {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("resources do not depend on the delivery mode: the default pass covers them")
	}
	bin := itest.BuildSidecar(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	writeFile(t, file, resourcesYAML)
	cfg := sidecar.Config{Resources: file, DataDir: filepath.Join(dir, "data")}
	sc := itest.Start(t, cfg, itest.Binary(bin))
	mustContain(t, "log", sc.Log(), "msg=\"resources applied\" file="+file+" created=6 updated=0 unchanged=0")

	resp, err := http.Get("http://" + sc.HTTP + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %v %v", resp, err)
	}
	resp.Body.Close()

	ctx := context.Background()
	c := sc.GoClient()
	got := declared(t, c)
	orders := got[topicPath("orders")].(*pb.Topic)
	if orders.GetLabels()["team"] != "checkout" || orders.GetMessageRetentionDuration().AsDuration() != 24*time.Hour {
		t.Errorf("topic orders: %v", orders)
	}
	if ss := got[topicPath("validated")].(*pb.Topic).GetSchemaSettings(); ss.GetSchema() != "projects/"+itest.Project+"/schemas/order" || ss.GetEncoding() != pb.Encoding_JSON {
		t.Errorf("topic validated: schema settings %v", ss)
	}
	ordered := got[subPath("orders-ordered")].(*pb.Subscription)
	if ordered.GetTopic() != topicPath("orders") || !ordered.GetEnableMessageOrdering() || ordered.GetAckDeadlineSeconds() != 20 ||
		ordered.GetLabels()["jetorder-ordering"] != "strict" || ordered.GetLabels()["jetorder-delivery"] == "" ||
		ordered.GetDeadLetterPolicy().GetDeadLetterTopic() != topicPath("dead") || ordered.GetDeadLetterPolicy().GetMaxDeliveryAttempts() != 10 ||
		ordered.GetRetryPolicy().GetMinimumBackoff().AsDuration() != time.Second || ordered.GetRetryPolicy().GetMaximumBackoff().AsDuration() != 600*time.Second {
		t.Errorf("subscription orders-ordered: %v", ordered)
	}
	filtered := got[subPath("orders-filtered")].(*pb.Subscription)
	if filtered.GetFilter() != `attributes.region = "eu"` || !filtered.GetEnableExactlyOnceDelivery() || filtered.GetEnableMessageOrdering() ||
		filtered.GetExpirationPolicy().GetTtl().AsDuration() != 48*time.Hour || filtered.GetMessageRetentionDuration().AsDuration() != time.Hour {
		t.Errorf("subscription orders-filtered: %v", filtered)
	}
	schemas, err := vkit.NewSchemaClient(ctx, itest.ClientOptions(sc.GRPC)...)
	if err != nil {
		t.Fatal(err)
	}
	defer schemas.Close()
	sch, err := schemas.GetSchema(ctx, &pb.GetSchemaRequest{Name: "projects/" + itest.Project + "/schemas/order"})
	if err != nil || sch.GetType() != pb.Schema_AVRO || !strings.Contains(sch.GetDefinition(), `"name": "Order"`) {
		t.Errorf("schema order: %v, %v", sch, err)
	}
	v1, err := pubsubv1.NewClient(ctx, itest.Project, itest.ClientOptions(sc.GRPC)...)
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	if sc1, err := v1.Subscription("orders-ordered").Config(ctx); err != nil || !sc1.EnableMessageOrdering || sc1.AckDeadline != 20*time.Second ||
		sc1.DeadLetterPolicy == nil || sc1.DeadLetterPolicy.MaxDeliveryAttempts != 10 {
		t.Errorf("v1 client: subscription orders-ordered %+v, %v", sc1, err)
	}

	// The ordered subscription delivers each key in order.
	chk := ordercheck.New()
	pub := c.Publisher("orders")
	pub.EnableMessageOrdering = true
	itest.PublishChecked(t, pub, chk, []string{"a", "b", "c"}, 0, 50)
	pub.Stop()
	stop := itest.ReceiveGo(t, c.Subscriber("orders-ordered"), itest.CheckedHandler(chk, "orders-ordered", 0))
	testutil.Eventually(t, 30*time.Second, func() bool { return chk.Complete("orders-ordered") }, "ordered delivery: %s", chk.Missing("orders-ordered"))
	stop()
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("order violations: %v", v)
	}

	// The same file again: nothing changes.
	sc = sc.Restart()
	mustContain(t, "log after a restart", sc.Log(), "created=0 updated=0 unchanged=6")
	for name, m := range declared(t, sc.GoClient()) {
		if !proto.Equal(m, got[name]) {
			t.Errorf("%s changed by a restart with the same file:\n%v\nwas\n%v", name, m, got[name])
		}
	}

	// A change an update can make: made, and nothing else.
	updated := strings.Replace(strings.Replace(resourcesYAML, "ackDeadlineSeconds: 20", "ackDeadlineSeconds: 45", 1),
		"{team: checkout}", "{team: billing}", 1)
	updated = strings.Replace(updated, "retryPolicy: {minimumBackoff: 1s}", "retryPolicy: {minimumBackoff: 1s, maximumBackoff: 30s}", 1)
	writeFile(t, file, updated)
	sc = sc.Restart()
	log := unquoted(sc.Log())
	mustContain(t, "log after an update", log, "created=0 updated=2 unchanged=4")
	mustContain(t, "log after an update", log, `msg="resource updated" name=projects/test-project/subscriptions/orders-ordered fields=ack_deadline_seconds,retry_policy`)
	mustContain(t, "log after an update", log, `msg="resource updated" name=projects/test-project/topics/orders fields=labels`)
	now := declared(t, sc.GoClient())
	want := map[string]proto.Message{}
	for name, m := range got {
		want[name] = proto.Clone(m)
	}
	want[topicPath("orders")].(*pb.Topic).Labels["team"] = "billing"
	wantSub := want[subPath("orders-ordered")].(*pb.Subscription)
	wantSub.AckDeadlineSeconds = 45
	wantSub.RetryPolicy.MaximumBackoff = durationpb.New(30 * time.Second)
	for name, m := range now {
		if !proto.Equal(m, want[name]) {
			t.Errorf("%s after the update:\n%v\nwant\n%v", name, m, want[name])
		}
	}
	sc.Stop()

	// Changes no update can make (with one that it could): refused, each
	// with its line, and nothing changes.
	fixed := strings.Replace(updated, "enableMessageOrdering: true", "enableMessageOrdering: false", 1)
	fixed = strings.Replace(fixed, `filter: attributes.region = "eu"`, `filter: attributes.region = "us"`, 1)
	fixed = strings.Replace(fixed, `{"name": "id", "type": "int"}`, `{"name": "id", "type": "long"}`, 1)
	fixed = strings.Replace(fixed, "ackDeadlineSeconds: 45", "ackDeadlineSeconds: 60", 1)
	fixed = strings.Replace(fixed, "{team: billing}", "{team: sales}", 1) // a resource without a refused change
	writeFile(t, file, fixed)
	_, err = itest.StartErr(t, cfg, itest.Binary(bin))
	for _, w := range []string{
		"sidecar exited with 1",
		fmt.Sprintf(`%s:%d: subscription "orders-ordered": enableMessageOrdering cannot change after creation: the subscription has true, the file false`, file, lineOf(t, fixed, "enableMessageOrdering: false")),
		fmt.Sprintf(`%s:%d: subscription "orders-filtered": filter cannot change after creation`, file, lineOf(t, fixed, "filter:")),
		fmt.Sprintf(`%s:%d: schema "order": definition differs from the schema's newest revision`, file, lineOf(t, fixed, "definition:")),
	} {
		if err == nil || !strings.Contains(unquoted(err.Error()), w) {
			t.Errorf("start with changes that cannot be made: %v\nwant %q", err, w)
		}
	}

	// A file that is not valid: exit 2, with the line.
	writeFile(t, file, strings.Replace(updated, "ackDeadlineSeconds: 45", "ackDeadline: 45", 1))
	_, err = itest.StartErr(t, cfg, itest.Binary(bin))
	w := fmt.Sprintf(`sidecar: --resources: %s:%d: subscription "orders-ordered": unknown field "ackDeadline"`, file, lineOf(t, updated, "ackDeadlineSeconds: 45"))
	if err == nil || !strings.Contains(err.Error(), "sidecar exited with 2") || !strings.Contains(err.Error(), w) {
		t.Errorf("start with a file that is not valid: %v\nwant exit 2 and %q", err, w)
	}

	// Neither changed anything.
	writeFile(t, file, updated)
	sc = itest.Start(t, cfg, itest.Binary(bin))
	mustContain(t, "log after the refusals", sc.Log(), "created=0 updated=0 unchanged=6")
	for name, m := range declared(t, sc.GoClient()) {
		if !proto.Equal(m, want[name]) {
			t.Errorf("%s after the refused starts:\n%v\nwant\n%v", name, m, want[name])
		}
	}
}

// Three sidecars on one NATS server started at once with the same file
// all start, each resource is created by exactly one of them, and none
// updates anything: the others found it as declared.
func TestResourcesThreeSidecarsConverge(t *testing.T) {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("resources do not depend on the delivery mode: the default pass covers them")
	}
	var b strings.Builder
	b.WriteString("projects:\n  test-project:\n    schemas:\n")
	const n = 8
	for i := range 2 {
		fmt.Fprintf(&b, "      schema-%d: {type: AVRO, definition: '{\"type\": \"record\", \"name\": \"R%d\", \"fields\": []}'}\n", i, i)
	}
	b.WriteString("    topics:\n")
	for i := range n {
		fmt.Fprintf(&b, "      topic-%d: {labels: {n: '%d'}, messageRetentionDuration: 1h}\n", i, i)
	}
	b.WriteString("    subscriptions:\n")
	for i := range n {
		fmt.Fprintf(&b, "      sub-%d: {topic: topic-%d, enableMessageOrdering: %v, ackDeadlineSeconds: %d, deadLetterPolicy: {deadLetterTopic: topic-%d}, retryPolicy: {minimumBackoff: 2s}}\n",
			i, i, i%2 == 0, 10+i, (i+1)%n)
	}
	const total = 2 + 2*n
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, b.String())

	url := testutil.Server(t).ClientURL()
	type started struct {
		sc  *itest.Sidecar
		log *testutil.LogBuffer
		err error
	}
	results := make(chan started, 3)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			log := &testutil.LogBuffer{}
			sc, err := itest.StartErr(t, sidecar.Config{NATSURL: url, Resources: file},
				itest.Logger(slog.New(slog.NewJSONHandler(log, nil))))
			results <- started{sc, log, err}
		})
	}
	wg.Wait()
	close(results)
	created := 0
	var scs []*itest.Sidecar
	for r := range results {
		if r.err != nil {
			t.Errorf("a sidecar did not start: %v", r.err)
			continue
		}
		scs = append(scs, r.sc)
		var applied struct{ Created, Updated, Unchanged int }
		for _, l := range r.log.Lines() {
			if strings.Contains(l, `"msg":"resources applied"`) {
				if err := json.Unmarshal([]byte(l), &applied); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("a sidecar applied the file: %+v", applied)
		if applied.Created+applied.Unchanged != total || applied.Updated != 0 {
			t.Errorf("a sidecar applied %+v, want %d created or unchanged, none updated", applied, total)
		}
		created += applied.Created
	}
	if created != total {
		t.Errorf("%d resources created in all, want each of %d once", created, total)
	}
	if len(scs) == 0 {
		return
	}
	ctx := context.Background()
	c := scs[len(scs)-1].GoClient()
	for i := range n {
		s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(fmt.Sprintf("sub-%d", i))})
		if err != nil || s.GetAckDeadlineSeconds() != int32(10+i) || s.GetEnableMessageOrdering() != (i%2 == 0) ||
			s.GetDeadLetterPolicy().GetDeadLetterTopic() != topicPath(fmt.Sprintf("topic-%d", (i+1)%n)) {
			t.Errorf("subscription s%d: %v, %v", i, s, err)
		}
	}
}

// /readyz answers only once the declared resources exist: a client that
// waits for it finds the last declared subscription.
func TestResourcesBeforeReady(t *testing.T) {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("resources do not depend on the delivery mode: the default pass covers them")
	}
	var b strings.Builder
	b.WriteString("projects:\n  test-project:\n    topics:\n      topic: {}\n    subscriptions:\n")
	const n = 30
	for i := range n {
		fmt.Fprintf(&b, "      sub-%d: {topic: topic, enableMessageOrdering: true}\n", i)
	}
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, b.String())
	cfg := sidecar.Config{Resources: file, GRPCAddr: itest.FreeAddr(t), HTTPAddr: itest.FreeAddr(t)}

	sub := pb.NewSubscriberClient(itest.Dial(t, cfg.GRPCAddr)) // connects at its first call
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	found := make(chan error, 1)
	go func() {
		client := &http.Client{Timeout: 30 * time.Second}
		for ctx.Err() == nil {
			resp, err := client.Get("http://" + cfg.HTTPAddr + "/readyz")
			if err != nil || resp.StatusCode != http.StatusOK {
				if err == nil {
					resp.Body.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Millisecond):
				}
				continue
			}
			resp.Body.Close()
			_, err = sub.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(fmt.Sprintf("sub-%d", n-1))})
			found <- err
			return
		}
		found <- ctx.Err()
	}()
	itest.Start(t, cfg)
	if err := <-found; err != nil {
		t.Fatalf("the last declared subscription once /readyz answered: %v", err)
	}
}

// The example file of deploy/ applies (its push endpoint allowed), and
// gcloud reads what it declares.
func TestResourcesExampleFile(t *testing.T) {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("resources do not depend on the delivery mode: the default pass covers them")
	}
	sc := itest.Start(t, sidecar.Config{Resources: "../deploy/resources.example.yaml", PushAllow: "app"})
	ctx := context.Background()
	c := itest.GoClientOf(t, sc.GRPC, "my-project")
	s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: "projects/my-project/subscriptions/orders-billing"})
	if err != nil || s.GetLabels()["jetorder-partitions"] != "16" || s.GetDeadLetterPolicy().GetMaxDeliveryAttempts() != 10 {
		t.Errorf("orders-billing: %v, %v", s, err)
	}
	tp, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/my-project/topics/orders"})
	if err != nil || tp.GetLabels()["jetorder-key-streams"] != "4" || tp.GetSchemaSettings().GetSchema() != "projects/my-project/schemas/order-event" {
		t.Errorf("orders: %v, %v", tp, err)
	}
	if _, err := exec.LookPath("gcloud"); err != nil {
		t.Log("gcloud is not installed: not read through gcloud")
		return
	}
	if got := gcloudValue(t, sc, "subscriptions", "describe", "projects/my-project/subscriptions/orders-billing", "--format=value(ackDeadlineSeconds)"); got != "30" {
		t.Errorf("gcloud: ackDeadlineSeconds %q, want 30", got)
	}
	if got := gcloudValue(t, sc, "topics", "describe", "projects/my-project/topics/orders", "--format=value(labels.team)"); got != "checkout" {
		t.Errorf("gcloud: label team %q, want checkout", got)
	}
}
