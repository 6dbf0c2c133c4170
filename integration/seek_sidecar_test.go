package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"
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
		mustCreateSub(t, c, &pb.Subscription{Name: subPath("sub"), Topic: topicPath("top"), EnableMessageOrdering: true})

		_, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub")})
		wantCode(t, "seek without a target", err, codes.InvalidArgument)
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("missing"), Target: &pb.SeekRequest_Time{Time: timestamppb.Now()}})
		wantCode(t, "seek a missing subscription", err, codes.NotFound)
		if b.fake {
			_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapshotPath("snap"), Subscription: subPath("sub")})
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
		snap, err := subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapshotPath("snap"), Subscription: subPath("sub"), Labels: map[string]string{"a": "b"}})
		if err != nil {
			t.Fatalf("CreateSnapshot: %v", err)
		}
		if snap.Topic != topicPath("top") || snap.Labels["a"] != "b" || snap.ExpireTime.AsTime().Before(time.Now().Add(6*24*time.Hour)) {
			t.Errorf("CreateSnapshot returned %v", snap)
		}
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapshotPath("snap"), Subscription: subPath("sub")})
		wantCode(t, "create an existing snapshot", err, codes.AlreadyExists)
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapshotPath("other"), Subscription: subPath("missing")})
		wantCode(t, "snapshot a missing subscription", err, codes.NotFound)
		_, err = subs.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: "snapshots/bad", Subscription: subPath("sub")})
		wantCode(t, "snapshot with a bad name", err, codes.InvalidArgument)
		got, err := subs.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: snapshotPath("snap")})
		if err != nil || got.Topic != topicPath("top") {
			t.Fatalf("GetSnapshot: %v, %v", got, err)
		}
		upd, err := subs.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
			Snapshot:   &pb.Snapshot{Name: snapshotPath("snap"), Labels: map[string]string{"c": "d"}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}},
		})
		if err != nil || upd.Labels["c"] != "d" || len(upd.Labels) != 1 {
			t.Fatalf("UpdateSnapshot: %v, %v", upd, err)
		}
		_, err = subs.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
			Snapshot:   &pb.Snapshot{Name: snapshotPath("snap"), Topic: topicPath("x")},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"topic"}},
		})
		wantCode(t, "update a snapshot's topic", err, codes.InvalidArgument)
		it := subs.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: "projects/" + project})
		if s, err := it.Next(); err != nil || s.Name != snapshotPath("snap") {
			t.Fatalf("ListSnapshots: %v, %v", s, err)
		}

		// Five more, acked; seeking to the snapshot brings them back, in
		// order, and only them.
		publishN(10, 15)
		if got := receiveData(5); !slices.Equal(got, want(10, 15)) {
			t.Fatalf("second delivery: %v", got)
		}
		if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: snapshotPath("snap")}}); err != nil {
			t.Fatalf("Seek(snapshot): %v", err)
		}
		if got := receiveData(5); !slices.Equal(got, want(10, 15)) {
			t.Fatalf("after seeking to the snapshot: %v", got)
		}

		// Seek to a time before everything: all fifteen again, in order.
		if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.New(before)}}); err != nil {
			t.Fatalf("Seek(time): %v", err)
		}
		if got := receiveData(15); !slices.Equal(got, want(0, 15)) {
			t.Fatalf("after seeking back in time: %v", got)
		}

		// Seek to now: nothing old comes again, the next new message first.
		if _, err := subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub"), Target: &pb.SeekRequest_Time{Time: timestamppb.Now()}}); err != nil {
			t.Fatalf("Seek(now): %v", err)
		}
		publishN(15, 16)
		if got := receiveData(1); !slices.Equal(got, want(15, 16)) {
			t.Fatalf("after seeking to now: %v", got)
		}

		// A snapshot of another topic cannot be sought to.
		mustCreateTopic(t, c, "other-top")
		mustCreateSub(t, c, &pb.Subscription{Name: subPath("other-sub"), Topic: topicPath("other-top")})
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("other-sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: snapshotPath("snap")}})
		wantCode(t, "seek to another topic's snapshot", err, codes.FailedPrecondition)

		if err := subs.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: snapshotPath("snap")}); err != nil {
			t.Fatalf("DeleteSnapshot: %v", err)
		}
		_, err = subs.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: snapshotPath("snap")})
		wantCode(t, "get a deleted snapshot", err, codes.NotFound)
		_, err = subs.Seek(ctx, &pb.SeekRequest{Subscription: subPath("sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: snapshotPath("snap")}})
		wantCode(t, "seek to a deleted snapshot", err, codes.NotFound)
	})
}
