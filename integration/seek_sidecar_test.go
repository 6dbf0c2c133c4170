package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

func snapshotPath(id string) string { return "projects/" + project + "/snapshots/" + id }

// Seek to a time and to a snapshot, and the snapshot RPCs, through Google's
// Go client. pstest implements Seek to a time only (and redelivers
// messages without their data), and no snapshot RPC.
func TestParitySeekAndSnapshots(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		subs := c.SubscriptionAdminClient
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top"), EnableMessageOrdering: true})

		_, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub")})
		wantCode(t, "seek without a target", err, codes.InvalidArgument)
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("missing"), Target: &pb.SeekRequest_Time{Time: timestamppb.Now()}})
		wantCode(t, "seek a missing subscription", err, codes.NotFound)
		if b.fake {
			_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: b.snapshot("snap"), Subscription: b.sub("sub")})
			wantCode(t, "pstest CreateSnapshot", err, codes.Unimplemented)
			return
		}

		pub := c.Publisher("top")
		pub.EnableMessageOrdering = true
		defer pub.Stop()
		publishN := func(from, to int) {
			t.Helper()
			for i := from; i < to; i++ {
				if _, err := pub.Publish(ctx, &pubsub.Message{Data: fmt.Appendf(nil, "m%d", i), OrderingKey: "k"}).Get(ctx); err != nil {
					t.Fatalf("publish m%d: %v", i, err)
				}
			}
		}
		receiveData := func(n int) []string {
			t.Helper()
			var out []string
			for _, m := range receiveAll(t, c.Subscriber("sub"), n, nil) {
				out = append(out, string(m.Data))
			}
			return out
		}
		want := func(from, to int) []string {
			var out []string
			for i := from; i < to; i++ {
				out = append(out, fmt.Sprintf("m%d", i))
			}
			return out
		}

		before := time.Now()
		publishN(0, 10)
		if got := receiveData(10); !slices.Equal(got, want(0, 10)) {
			t.Fatalf("first delivery: %v", got)
		}

		// Snapshots: taken when all ten are acked.
		snap, err := subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: b.snapshot("snap"), Subscription: b.sub("sub"), Labels: map[string]string{"a": "b"}})
		if err != nil {
			t.Fatalf("CreateSnapshot: %v", err)
		}
		// Google's emulator keeps no labels of snapshots.
		if snap.Topic != b.topic("top") || (snap.Labels["a"] != "b") != b.emulator || snap.ExpireTime.AsTime().Before(time.Now().Add(6*24*time.Hour)) {
			t.Errorf("CreateSnapshot returned %v", snap)
		}
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: b.snapshot("snap"), Subscription: b.sub("sub")})
		wantCode(t, "create an existing snapshot", err, codes.AlreadyExists)
		// Without a name, the service names the snapshot in the
		// subscription's project; Google's emulator refuses.
		named, err := subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Subscription: b.sub("sub")})
		if b.emulator {
			wantCode(t, "the emulator's snapshot without a name", err, codes.InvalidArgument)
		} else {
			if err != nil || !strings.HasPrefix(named.Name, b.snapshot("snapshot-")) || named.Topic != b.topic("top") {
				t.Fatalf("CreateSnapshot without a name: %v, %v", named, err)
			}
			if got, err := subs.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: named.Name}); err != nil || got.Name != named.Name {
				t.Fatalf("GetSnapshot(%s): %v, %v", named.Name, got, err)
			}
			if err := subs.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: named.Name}); err != nil {
				t.Fatal(err)
			}
		}
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: b.snapshot("other"), Subscription: b.sub("missing")})
		wantCode(t, "snapshot a missing subscription", err, codes.NotFound)
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: "snapshots/bad", Subscription: b.sub("sub")})
		wantCode(t, "snapshot with a bad name", err, codes.InvalidArgument)
		got, err := subs.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: b.snapshot("snap")})
		if err != nil || got.Topic != b.topic("top") {
			t.Fatalf("GetSnapshot: %v, %v", got, err)
		}
		upd, err := subs.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
			Snapshot:   &pb.Snapshot{Name: b.snapshot("snap"), Labels: map[string]string{"c": "d"}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}},
		})
		if b.emulator {
			wantCode(t, "the emulator's UpdateSnapshot", err, codes.Unimplemented)
		} else {
			if err != nil || upd.Labels["c"] != "d" || len(upd.Labels) != 1 {
				t.Fatalf("UpdateSnapshot: %v, %v", upd, err)
			}
			_, err = subs.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
				Snapshot:   &pb.Snapshot{Name: b.snapshot("snap"), Topic: b.topic("x")},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"topic"}},
			})
			wantCode(t, "update a snapshot's topic", err, codes.InvalidArgument)
		}
		it := subs.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: "projects/" + c.Project()})
		if s, err := it.Next(); err != nil || s.Name != b.snapshot("snap") {
			t.Fatalf("ListSnapshots: %v, %v", s, err)
		}

		// Five more, acked; seeking to the snapshot brings them back, in
		// order, and only them.
		publishN(10, 15)
		if got := receiveData(5); !slices.Equal(got, want(10, 15)) {
			t.Fatalf("second delivery: %v", got)
		}
		if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: b.snapshot("snap")}}); err != nil {
			t.Fatalf("Seek(snapshot): %v", err)
		}
		if got := receiveData(5); !slices.Equal(got, want(10, 15)) {
			t.Fatalf("after seeking to the snapshot: %v", got)
		}

		if b.emulator {
			// Google's emulator seeks to snapshots only.
			_, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.New(before)}})
			wantCode(t, "the emulator's Seek(time)", err, codes.Unimplemented)
		} else {
			// Seek to a time before everything: all fifteen again, in order.
			if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.New(before)}}); err != nil {
				t.Fatalf("Seek(time): %v", err)
			}
			if got := receiveData(15); !slices.Equal(got, want(0, 15)) {
				t.Fatalf("after seeking back in time: %v", got)
			}

			// Seek to now: nothing old comes again, the next new message first.
			if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.Now()}}); err != nil {
				t.Fatalf("Seek(now): %v", err)
			}
			publishN(15, 16)
			if got := receiveData(1); !slices.Equal(got, want(15, 16)) {
				t.Fatalf("after seeking to now: %v", got)
			}
		}

		// A snapshot of another topic cannot be sought to.
		mustCreateTopic(t, c, "other-top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("other-sub"), Topic: b.topic("other-top")})
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("other-sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: b.snapshot("snap")}})
		wantCode(t, "seek to another topic's snapshot", err, codes.FailedPrecondition)

		if err := subs.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: b.snapshot("snap")}); err != nil {
			t.Fatalf("DeleteSnapshot: %v", err)
		}
		_, err = subs.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: b.snapshot("snap")})
		wantCode(t, "get a deleted snapshot", err, codes.NotFound)
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: b.sub("sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: b.snapshot("snap")}})
		wantCode(t, "seek to a deleted snapshot", err, codes.NotFound)
	})
}

// Seek with Google's Go client receiving: 50 ordered keys stream to two
// clients of one sidecar, and the subscription is sought back to before
// the first message while messages are out with the clients. The checker
// sees every delivery: no key has two messages in handlers across the
// seek, and every key starts again from its first message.
func TestSidecarSeekWhileReceiving(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	ctx := context.Background()
	mustCreateTopic(t, c, "top")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("sub"), Topic: topicPath("top"), EnableMessageOrdering: true})
	chk := ordercheck.New()
	chk.AcksMayBeLost() // the seek takes keys back to messages acked before
	var mu sync.Mutex
	delivered := map[string][]time.Time{} // by payload
	handler := func(_ context.Context, m *pubsub.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		chk.Delivered("sub", key, idx)
		mu.Lock()
		delivered[string(m.Data)] = append(delivered[string(m.Data)], time.Now())
		mu.Unlock()
		chk.Acked("sub", key, idx)
		m.Ack()
	}
	receiveGo(t, c.Subscriber("sub"), handler)
	receiveGo(t, sc.GoClient().Subscriber("sub"), handler)

	pub := c.Publisher("top")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	const keys, msgs = 50, 20
	publishRounds := func(from, to int) {
		t.Helper()
		var results []*pubsub.PublishResult
		for i := from; i < to; i++ {
			for k := range keys {
				key := fmt.Sprintf("key-%d", k)
				chk.Published(key, i)
				results = append(results, pub.Publish(ctx, &pubsub.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
			}
		}
		for _, r := range results {
			if _, err := r.Get(ctx); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	start := time.Now()
	publishRounds(0, msgs/2)
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete("sub") }, "first half not acked: %s", func() string { return chk.Missing("sub") })
	publishRounds(msgs/2, msgs) // streaming to the clients as the seek comes
	if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.New(start)}}); err != nil {
		t.Fatalf("Seek: %v", err)
	}
	sought := time.Now()
	// Every message comes again after the seek.
	again := func() (n int, missing string) {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			for i := range msgs {
				id := string(ordercheck.Encode(fmt.Sprintf("key-%d", k), i))
				if ts := delivered[id]; len(ts) > 0 && !ts[len(ts)-1].Before(sought) {
					n++
				} else if missing == "" {
					missing = id
				}
			}
		}
		return n, missing
	}
	testutil.Eventually(t, 90*time.Second, func() bool { n, _ := again(); return n == keys*msgs && chk.Complete("sub") },
		"after the seek: %v", func() string {
			n, m := again()
			return fmt.Sprintf("%d of %d came again (not %s); %s", n, keys*msgs, m, chk.Missing("sub"))
		})
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	st := chk.Stats("sub")
	t.Logf("%d deliveries, %d redeliveries, %d rewinds", st.Deliveries, st.Redeliveries, st.Rewinds)
}
