package upgrade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// An earlier build of the sidecar (itest.Releases) creates one resource of
// every kind, with access control on, and stores messages that its
// subscriptions ack in part; today's build, started on the same data dir,
// must show every resource as the old one did and deliver, enforce, stamp,
// seek, filter and dead-letter as if nothing had happened. upgradeCheck
// collects what failed instead of failing the test, so that
// TestUpgradeCheckCatchesLoss can show that it sees a loss.

const (
	upgradeN     = 3 // messages of each key acked under the old build; as many more are left to the new one
	upgradeMaxDL = 5 // the dead-letter policy's max_delivery_attempts (Pub/Sub's minimum)
)

var (
	upgradeKeys   = []string{"k0", "k1", "k2"}
	upgradeTopics = []string{"orders", "colors", "poison", "dead", "didcomm", "typed"}
	// upgradeOrdered are the ordered subscriptions of "orders", one for
	// each delivery mode and ordering (labels jetorder-delivery and
	// jetorder-ordering, internal/pubsubapi/subscriber.go).
	upgradeOrdered = []struct {
		id       string
		delivery adapter.DeliveryMode
		ordering pubsubapi.Ordering
	}{
		{"perkey-strict", adapter.DeliveryPerKey, pubsubapi.StrictOrdering},
		{"perkey-pipelined", adapter.DeliveryPerKey, pubsubapi.PipelinedOrdering},
		{"partitioned-strict", adapter.DeliveryPartitioned, pubsubapi.StrictOrdering},
		{"partitioned-pipelined", adapter.DeliveryPartitioned, pubsubapi.PipelinedOrdering},
	}
	upgradeSchema = "projects/" + itest.Project + "/schemas/states"
	upgradeSnap   = "projects/" + itest.Project + "/snapshots/snap"
	upgradePolicy = "policy of " + itest.SubPath("iam-granted")
)

const upgradeAvro = `{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"}]}`

// upgradeSubscriptions are every subscription the old build creates; ack
// deadlines differ from the default so that a reset would show.
func upgradeSubscriptions(pushURL string) []*pb.Subscription {
	var subs []*pb.Subscription
	for i, o := range upgradeOrdered {
		subs = append(subs, &pb.Subscription{Name: itest.SubPath(o.id), Topic: itest.TopicPath("orders"), EnableMessageOrdering: true,
			AckDeadlineSeconds: int32(11 + i), Labels: map[string]string{"jetorder-delivery": string(o.delivery), "jetorder-ordering": string(o.ordering)}})
	}
	return append(subs,
		&pb.Subscription{Name: itest.SubPath("plain"), Topic: itest.TopicPath("orders"), AckDeadlineSeconds: 15},
		&pb.Subscription{Name: itest.SubPath("pushed"), Topic: itest.TopicPath("orders"), EnableMessageOrdering: true,
			PushConfig: &pb.PushConfig{PushEndpoint: pushURL},
			// Short backoffs: the endpoint refuses everything until the upgrade.
			RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(100 * time.Millisecond), MaximumBackoff: durationpb.New(time.Second)}},
		&pb.Subscription{Name: itest.SubPath("filtered"), Topic: itest.TopicPath("colors"), EnableMessageOrdering: true, Filter: `attributes.color = "red"`},
		&pb.Subscription{Name: itest.SubPath("iam-granted"), Topic: itest.TopicPath("colors")},
		&pb.Subscription{Name: itest.SubPath("dl-src"), Topic: itest.TopicPath("poison"),
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: itest.TopicPath("dead"), MaxDeliveryAttempts: upgradeMaxDL}},
		&pb.Subscription{Name: itest.SubPath("dead-sub"), Topic: itest.TopicPath("dead")},
		&pb.Subscription{Name: itest.SubPath("didcomm-sub"), Topic: itest.TopicPath("didcomm")},
	)
}

// upgradeStore is a data dir the old build wrote, and what the test knows
// of what it holds.
type upgradeStore struct {
	cfg    sidecar.Config // data dir and NATS address, the same for both builds
	access *itest.Access
	chk    map[string]*ordercheck.Checker // by subscription: the ordered ones of "orders"
	accept atomic.Bool                    // the push endpoint acks from now on
	before map[string]proto.Message       // every resource by name, as the old build showed it
	dlSeen int                            // the dead-letter source's last delivery attempt seen by the old build
}

func TestUpgradeFromRelease(t *testing.T) {
	t.Parallel()
	for _, r := range itest.Releases {
		t.Run(r.Short(), func(t *testing.T) {
			t.Parallel()
			u := upgradeFromOld(t, r)
			start := time.Now()
			sc := itest.Start(t, u.cfg, itest.WithAccess(u.access))
			for _, f := range upgradeCheck(t, u, sc, 60*time.Second) {
				t.Error(f)
			}
			t.Logf("from %s (%s): today's build checked in %v", r.Short(), r.Note, time.Since(start).Round(time.Millisecond))
		})
	}
}

// The negative control: the same checks, on a store that lost a
// subscription's registry record and a stored message between the two
// runs (with a bare nats-server on the data dir), must name both.
func TestUpgradeCheckCatchesLoss(t *testing.T) {
	t.Parallel()
	u := upgradeFromOld(t, itest.Releases[len(itest.Releases)-1])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testutil.ServerAt(t, u.cfg.DataDir, -1)
	nc := testutil.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "JO_SUBSCRIPTIONS") // the registry (docs/WIRE.md)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, keyrouter.KVKey(itest.Project, "perkey-strict")); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, keyrouter.StreamName(itest.Project, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	// k2's last message, which no subscription acked.
	last, err := stream.GetLastMsgForSubject(ctx, keyrouter.KeyedSubject(itest.Project, "orders", "k2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, last.Sequence); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	srv.Shutdown()

	sc := itest.Start(t, u.cfg, itest.WithAccess(u.access))
	// A short wait: what was lost is reported however long it is.
	failures := upgradeCheck(t, u, sc, 5*time.Second)
	lastK2 := fmt.Sprintf(`key "k2": %d of %d acked`, 2*upgradeN-1, 2*upgradeN)
	for _, lost := range []string{itest.SubPath("perkey-strict") + ": ", lastK2} {
		if !slices.ContainsFunc(failures, func(f string) bool { return strings.Contains(f, lost) }) {
			t.Errorf("the checks did not report %q; they reported:\n%s", lost, strings.Join(failures, "\n"))
		}
	}
}

// upgradeFromOld runs the sidecar of release r on a new data dir: it
// creates the resources, publishes, acks the first upgradeN messages of
// each key on the pull subscriptions of "orders", leaves the rest, and
// stops. A failure here is the old build's or the harness's.
func upgradeFromOld(t *testing.T, r itest.Release) *upgradeStore {
	t.Helper()
	u := &upgradeStore{cfg: sidecar.Config{DataDir: t.TempDir(), NATSListen: itest.FreeAddr(t)}, access: itest.NewAccess(t), chk: map[string]*ordercheck.Checker{}}
	for _, o := range upgradeOrdered {
		u.chk[o.id] = ordercheck.New()
		if o.ordering == pubsubapi.PipelinedOrdering {
			u.chk[o.id] = ordercheck.NewPipelined()
		}
	}
	u.chk["pushed"] = ordercheck.New()
	pushURL := upgradePushEndpoint(t, u)
	old := itest.Start(t, u.cfg, itest.Binary(itest.BuildSidecarAt(t, r.Commit)), itest.WithAccess(u.access))
	c := old.GoClientAs(u.access.Token("admin"))
	schemas := pb.NewSchemaServiceClient(old.ConnAs(u.access.Token("admin")))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("old build %s: %s: %v", r.Short(), what, err)
		}
	}

	_, err := schemas.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + itest.Project, SchemaId: "states", Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: upgradeAvro}})
	must("CreateSchema", err)
	for _, id := range upgradeTopics {
		tp := &pb.Topic{Name: itest.TopicPath(id), Labels: map[string]string{"kind": id}}
		if id == "typed" {
			tp.SchemaSettings = &pb.SchemaSettings{Schema: upgradeSchema, Encoding: pb.Encoding_JSON}
		}
		_, err := c.TopicAdminClient.CreateTopic(ctx, tp)
		must("CreateTopic "+id, err)
	}
	for _, s := range upgradeSubscriptions(pushURL) {
		itest.MustCreateSub(t, c, s)
	}
	_, err = c.SubscriptionAdminClient.SetIamPolicy(ctx, &iampb.SetIamPolicyRequest{Resource: itest.SubPath("iam-granted"),
		Policy: &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.subscriber", Members: []string{itest.AccessPrincipal("none")}}}}})
	must("SetIamPolicy", err)

	// The first messages, acked on every pull subscription of "orders";
	// the push endpoint refuses them.
	orders := c.Publisher("orders")
	orders.EnableMessageOrdering = true
	defer orders.Stop()
	u.publish(t, orders, 0, upgradeN)
	plain := &upgradeInbox{}
	stops := []func(){itest.ReceiveGo(t, c.Subscriber("plain"), plain.handler(true))}
	for _, o := range upgradeOrdered {
		stops = append(stops, itest.ReceiveGo(t, c.Subscriber(o.id), itest.CheckedHandler(u.chk[o.id], o.id, 0)))
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		return plain.received(upgradeData(0, upgradeN), 1) && u.missing() == ""
	}, "old build %s: the first messages were not all acked: %v; plain got %v", r.Short(), u.missing, plain.counts)
	for _, stop := range stops {
		stop()
	}
	_, err = c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: upgradeSnap, Subscription: itest.SubPath("plain"), Labels: map[string]string{"at": "second-batch"}})
	must("CreateSnapshot", err)
	u.publish(t, orders, upgradeN, 2*upgradeN) // left to the new build

	colors := c.Publisher("colors")
	colors.EnableMessageOrdering = true
	defer colors.Stop()
	upgradePublish(t, colors, upgradeColor("blue-1"), upgradeColor("red-1"))
	didcommPub := c.Publisher("didcomm")
	defer didcommPub.Stop()
	upgradePublish(t, didcommPub, upgradeBid("m1"), upgradeBid("m2"), upgradeBid("m3"))
	dl := c.Publisher("poison")
	defer dl.Stop()
	upgradePublish(t, dl, &pubsub.Message{Data: []byte("poison")})
	// Two failed deliveries under the old build (raw Pull and nack: the
	// client cannot stop after exactly two), so the count must carry over.
	for range 2 {
		var got *pb.ReceivedMessage
		testutil.Eventually(t, 30*time.Second, func() bool {
			resp, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: itest.SubPath("dl-src"), MaxMessages: 1})
			if err == nil && len(resp.ReceivedMessages) == 1 {
				got = resp.ReceivedMessages[0]
			}
			return got != nil
		}, "old build %s: dl-src delivered nothing", r.Short())
		u.dlSeen = int(got.DeliveryAttempt)
		must("nack", c.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: itest.SubPath("dl-src"), AckIds: []string{got.AckId}}))
	}

	u.before = map[string]proto.Message{}
	for name, get := range upgradeResources(c, schemas) {
		u.before[name], err = get(ctx)
		must("get "+name, err)
	}
	layout, err := adapter.AccountLayout(ctx, old.JetStream())
	if err != nil || layout != r.Layout {
		t.Fatalf("old build %s: layout record %d (%v), want %d as itest.Releases says", r.Short(), layout, err, r.Layout)
	}
	old.Stop()
	return u
}

// upgradeCheck starts receiving from today's sidecar sc, which runs on u's
// data dir, and returns every way it differs from what the old build
// stored. Every wait ends by one deadline, wait from now.
func upgradeCheck(t *testing.T, u *upgradeStore, sc *itest.Sidecar, wait time.Duration) []string {
	t.Helper()
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	deadline := time.Now().Add(wait)
	await := func(cond func() bool) bool { return testutil.Poll(time.Until(deadline), cond) }
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	c := sc.GoClientAs(u.access.Token("admin"))

	if v, err := adapter.AccountLayout(ctx, sc.JetStream()); err != nil || v != adapter.LayoutVersion {
		fail("layout record: version %d (%v), want adapter.LayoutVersion %d", v, err, adapter.LayoutVersion)
	}
	present := map[string]bool{}
	for name, get := range upgradeResources(c, pb.NewSchemaServiceClient(sc.ConnAs(u.access.Token("admin")))) {
		switch now, err := get(ctx); {
		case err != nil:
			fail("%s: %v", name, err)
		case !proto.Equal(now, u.before[name]):
			fail("%s changed in the upgrade:\nwas %v\nnow %v", name, u.before[name], now)
		default:
			present[name] = true
		}
	}

	// The resource policy: "none" may pull the one subscription it was
	// granted, and no other.
	none := pb.NewSubscriberClient(sc.ConnAs(u.access.Token("none")))
	if _, err := none.Pull(ctx, &pb.PullRequest{Subscription: itest.SubPath("iam-granted"), MaxMessages: 1, ReturnImmediately: true}); err != nil {
		fail("the subscriber granted on iam-granted cannot pull it: %v", err)
	}
	if _, err := none.Pull(ctx, &pb.PullRequest{Subscription: itest.SubPath("filtered"), MaxMessages: 1, ReturnImmediately: true}); status.Code(err) != codes.PermissionDenied {
		fail("the subscriber granted on iam-granted pulls filtered: %v, want PermissionDenied", err)
	}
	// The schema settings still validate.
	for data, want := range map[string]codes.Code{`{"name":"Alaska","post_abbr":"AK"}`: codes.OK, `{"name":"Alaska"}`: codes.InvalidArgument} {
		_, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: itest.TopicPath("typed"), Messages: []*pb.PubsubMessage{{Data: []byte(data)}}})
		if status.Code(err) != want {
			fail("publish %s to typed: %v, want %v", data, err, want)
		}
	}

	// Every receiver at once (not on a subscription that is gone: its
	// Receive would fail the test, not the check), then the new messages.
	receive := func(id string, h func(context.Context, *pubsub.Message)) {
		if present[itest.SubPath(id)] {
			itest.ReceiveGo(t, c.Subscriber(id), h)
		}
	}
	u.accept.Store(true)
	for _, o := range upgradeOrdered {
		receive(o.id, itest.CheckedHandler(u.chk[o.id], o.id, 0))
	}
	plain, filtered, didcommSub, dlSrc, dead := &upgradeInbox{}, &upgradeInbox{}, &upgradeInbox{}, &upgradeInbox{}, &upgradeInbox{}
	receive("plain", plain.handler(true))
	receive("filtered", filtered.handler(true))
	receive("didcomm-sub", didcommSub.handler(true))
	receive("dl-src", dlSrc.handler(false))
	receive("dead-sub", dead.handler(true))
	colors := c.Publisher("colors")
	colors.EnableMessageOrdering = true
	defer colors.Stop()
	upgradePublish(t, colors, upgradeColor("blue-2"), upgradeColor("red-2"))
	didcommPub := c.Publisher("didcomm")
	defer didcommPub.Stop()
	upgradePublish(t, didcommPub, upgradeBid("m4"))

	// Every message not acked, in order per key.
	for _, id := range slices.Sorted(maps.Keys(u.chk)) {
		chk := u.chk[id]
		if !await(func() bool { return chk.Complete(id) }) {
			fail("%s: not every message was delivered and acked after the upgrade: %s", id, chk.Missing(id))
		}
		for _, v := range chk.Violations() {
			fail("%s: %s", id, v)
		}
	}
	// The rest on plain, and all of it again after seeking to the
	// snapshot taken before it; never what was acked before.
	rest := upgradeData(upgradeN, 2*upgradeN)
	if !await(func() bool { return plain.received(rest, 1) }) {
		fail("plain: not every message left was delivered after the upgrade: %v", plain.counts())
	} else if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: itest.SubPath("plain"), Target: &pb.SeekRequest_Snapshot{Snapshot: upgradeSnap}}); err != nil {
		fail("plain: seek to the snapshot: %v", err)
	} else if !await(func() bool { return plain.received(rest, 2) }) {
		fail("plain: after the seek to the snapshot, not every message after it came again: %v", plain.counts())
	}
	for _, d := range upgradeData(0, upgradeN) {
		if n := plain.counts()[d]; n > 0 {
			fail("plain: %s, acked before the upgrade, delivered %d times after it", d, n)
		}
	}
	// The filter: red-1 and red-2 in order, so a blue one in between
	// would have come before red-2.
	if !await(func() bool { return slices.Contains(filtered.data(), "red-2") }) || !slices.Equal(filtered.data(), []string{"red-1", "red-2"}) {
		fail("filtered: received %q, want [red-1 red-2]", filtered.data())
	}
	// The DIDComm counter goes on: m4 gets the order after m3's.
	orders := map[string]uint64{}
	await(func() bool {
		for _, m := range didcommSub.msgs() {
			if h, err := didcomm.Read(&adapter.Message{Data: []byte(m.data), Attributes: m.attrs}); err == nil && h.From == "did:ex:alice" {
				orders[h.ID] = h.SenderOrder
			}
		}
		return len(orders) == 4
	})
	if want := map[string]uint64{"m1": 1, "m2": 2, "m3": 3, "m4": 4}; !maps.Equal(orders, want) {
		fail("didcomm-sub: sender_order by message %v, want %v", orders, want)
	}
	// The dead-letter policy: the count goes on from the old build's, and
	// the message moves after upgradeMaxDL deliveries.
	if !await(func() bool { return len(dead.msgs()) > 0 }) {
		fail("dl-src: nothing moved to dead; attempts seen after the upgrade: %v", dlSrc.attempts())
	} else if a := dead.msgs()[0].attrs; a[adapter.DeadLetterSourceDeliveryCountAttribute] != fmt.Sprint(upgradeMaxDL) || a[adapter.DeadLetterSourceSubscriptionAttribute] != itest.SubPath("dl-src") {
		fail("dead: moved with attributes %v, want %d deliveries from dl-src", a, upgradeMaxDL)
	}
	if at := dlSrc.attempts(); len(at) == 0 || at[0] <= u.dlSeen || !slices.IsSorted(at) || at[len(at)-1] != upgradeMaxDL {
		fail("dl-src: delivery attempts %v after the upgrade, want from above %d up to %d", at, u.dlSeen, upgradeMaxDL)
	}
	return failures
}

// upgradeResources fetches each resource the old build created, by name.
func upgradeResources(c *pubsub.Client, schemas pb.SchemaServiceClient) map[string]func(context.Context) (proto.Message, error) {
	get := map[string]func(context.Context) (proto.Message, error){
		upgradeSchema: func(ctx context.Context) (proto.Message, error) {
			return schemas.GetSchema(ctx, &pb.GetSchemaRequest{Name: upgradeSchema, View: pb.SchemaView_FULL})
		},
		upgradeSnap: func(ctx context.Context) (proto.Message, error) {
			return c.SubscriptionAdminClient.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: upgradeSnap})
		},
		upgradePolicy: func(ctx context.Context) (proto.Message, error) {
			return c.SubscriptionAdminClient.GetIamPolicy(ctx, &iampb.GetIamPolicyRequest{Resource: itest.SubPath("iam-granted")})
		},
	}
	for _, id := range upgradeTopics {
		get[itest.TopicPath(id)] = func(ctx context.Context) (proto.Message, error) {
			return c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: itest.TopicPath(id)})
		}
	}
	for _, s := range upgradeSubscriptions("") {
		get[s.Name] = func(ctx context.Context) (proto.Message, error) {
			return c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: s.Name})
		}
	}
	return get
}

// publish publishes messages from..to-1 of every key to "orders" and tells
// every checker, the push endpoint's included.
func (u *upgradeStore) publish(t *testing.T, p *pubsub.Publisher, from, to int) {
	t.Helper()
	itest.PublishChecked(t, p, nil, upgradeKeys, from, to)
	for _, chk := range u.chk {
		for _, k := range upgradeKeys {
			chk.Published(k, to-1)
		}
	}
}

// missing says what the ordered pull subscriptions have not acked.
func (u *upgradeStore) missing() string {
	var out []string
	for _, o := range upgradeOrdered {
		if m := u.chk[o.id].Missing(o.id); m != "" {
			out = append(out, o.id+": "+m)
		}
	}
	return strings.Join(out, "; ")
}

// upgradePushEndpoint serves the push subscription "pushed": every
// request is a delivery to its checker, refused (503) until u.accept and
// acked from then on.
func upgradePushEndpoint(t *testing.T, u *upgradeStore) string {
	chk := u.chk["pushed"]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Message struct {
				Data        []byte `json:"data"`
				OrderingKey string `json:"orderingKey"`
			} `json:"message"`
		}
		err := json.NewDecoder(r.Body).Decode(&body)
		key, idx, derr := ordercheck.Decode(body.Message.Data)
		if err != nil || derr != nil || key != body.Message.OrderingKey {
			chk.Fail("pushed: undecodable request %q (key %q): %v %v", body.Message.Data, body.Message.OrderingKey, err, derr)
			return // acked: it would come again forever
		}
		chk.Delivered("pushed", key, idx)
		if !u.accept.Load() {
			chk.Released("pushed", key, idx)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		chk.Acked("pushed", key, idx)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/push"
}

// upgradeInbox keeps what a Go client handler received, for the test
// goroutine to look at.
type upgradeInbox struct {
	mu  sync.Mutex
	got []upgradeMsg
}

type upgradeMsg struct {
	data    string
	attrs   map[string]string
	attempt int // 0 without a dead-letter policy
}

// handler records every message and acks it, or nacks it unless ack.
func (b *upgradeInbox) handler(ack bool) func(context.Context, *pubsub.Message) {
	return func(_ context.Context, m *pubsub.Message) {
		msg := upgradeMsg{data: string(m.Data), attrs: m.Attributes}
		if m.DeliveryAttempt != nil {
			msg.attempt = *m.DeliveryAttempt
		}
		b.mu.Lock()
		b.got = append(b.got, msg)
		b.mu.Unlock()
		if ack {
			m.Ack()
		} else {
			m.Nack()
		}
	}
}

func (b *upgradeInbox) msgs() []upgradeMsg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.got)
}

func (b *upgradeInbox) data() []string {
	var out []string
	for _, m := range b.msgs() {
		out = append(out, m.data)
	}
	return out
}

func (b *upgradeInbox) attempts() []int {
	var out []int
	for _, m := range b.msgs() {
		out = append(out, m.attempt)
	}
	return out
}

func (b *upgradeInbox) counts() map[string]int {
	n := map[string]int{}
	for _, m := range b.msgs() {
		n[m.data]++
	}
	return n
}

// received reports whether every one of data came at least times times.
func (b *upgradeInbox) received(data []string, times int) bool {
	n := b.counts()
	return !slices.ContainsFunc(data, func(d string) bool { return n[d] < times })
}

// upgradeData are the payloads of messages from..to-1 of every key.
func upgradeData(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		for _, k := range upgradeKeys {
			out = append(out, string(ordercheck.Encode(k, i)))
		}
	}
	return out
}

// upgradeColor is a message of "colors", all of one ordering key, with the
// attribute the filter reads: "red-1" has color red.
func upgradeColor(name string) *pubsub.Message {
	color, _, _ := strings.Cut(name, "-")
	return &pubsub.Message{Data: []byte(name), OrderingKey: "c", Attributes: map[string]string{"color": color}}
}

// upgradeBid is a DIDComm plaintext message of one thread and sender
// without sender_order, which the sidecar stamps.
func upgradeBid(id string) *pubsub.Message {
	return &pubsub.Message{
		Data:       fmt.Appendf(nil, `{"id":%q,"type":"https://example.org/upgrade/1.0/bid","thid":"upgrade-thread","from":"did:ex:alice","body":{}}`, id),
		Attributes: map[string]string{broker.AttrDIDComm: broker.DIDCommStamp},
	}
}

// upgradePublish publishes msgs in order and waits until all are stored.
func upgradePublish(t *testing.T, p *pubsub.Publisher, msgs ...*pubsub.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var results []*pubsub.PublishResult
	for _, m := range msgs {
		results = append(results, p.Publish(ctx, m))
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}
