package iam

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/jetorder/jetorder/internal/testutil"
)

// A store whose watch nats.go ended (here: the bucket deleted under it,
// so that its consumer cannot be created again) watches again once it
// can, and sees a policy set through another sidecar after that: before,
// it kept the policies it had for good.
func TestStoreWatchesAgainAfterItsWatchEnds(t *testing.T) {
	ctx := context.Background()
	js, s, logs := openStoreLosingBucket(t)
	defer s.Close()
	testutil.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(logs.String(), "policy watch ended")
	}, "the store's watch did not end within 60 s of its bucket's deletion; its log:\n%s", logs.String)

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: PolicyBucket})
	if err != nil {
		t.Fatal(err)
	}
	const resource = "projects/p/topics/t"
	pol := &iampb.Policy{Bindings: []*iampb.Binding{{Role: "roles/pubsub.viewer", Members: []string{"user:a@example.com"}}}}
	data, err := proto.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, policyKey(resource), data); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		got, _ := s.Get(resource)
		return proto.Equal(got, pol)
	}, "a policy set after the watch ended was not seen within 30 s; the store's log:\n%s", logs.String)
}

// A store closed while it tries to watch again stops, without waiting for
// the bucket (and without touching the watch that ended).
func TestStoreClosedWhileWatchingAgain(t *testing.T) {
	_, s, logs := openStoreLosingBucket(t)
	testutil.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(logs.String(), "policies not watched; trying again")
	}, "the store never tried to watch again; its log:\n%s", logs.String)
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s while the store tried to watch again")
	}
}

// openStoreLosingBucket opens a store on a server of its own, and deletes
// its bucket under it: nats.go then ends the store's watch. logs is the
// store's log.
func openStoreLosingBucket(t *testing.T) (js jetstream.JetStream, s *Store, logs *testutil.LogBuffer) {
	t.Helper()
	srv := testutil.Server(t)
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	logs = &testutil.LogBuffer{}
	if s, err = OpenStore(ctx, js, 1, slog.New(slog.NewTextHandler(logs, nil))); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, PolicyBucket); err != nil {
		t.Fatal(err)
	}
	return js, s, logs
}
