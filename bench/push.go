package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/adapter"
)

// push times the sidecar pushing msgs messages over keys keys to an HTTP
// endpoint in this process, with the same helper (and so the same clock)
// as the pull figures.
func (s *sidecarBench) push(keys, msgs int) float64 {
	return s.b.deliver(keys, msgs, func(sub *adapter.Subscription, done func()) func(context.Context) error {
		return func(ctx context.Context) error {
			e := startPushEndpoint(keys, done)
			defer e.srv.Close()
			// Through the API: the sidecar indexes push subscriptions
			// when their push_config is set, and only then pushes them.
			name := fmt.Sprintf("projects/%s/subscriptions/%s", project, sub.ID())
			admin := s.client.SubscriptionAdminClient
			check(admin.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: name,
				PushConfig: &pb.PushConfig{PushEndpoint: e.url}}))
			<-ctx.Done()
			// Checked before the delete: the sidecar still receives then,
			// and the adapter's clean-up takes the deleted key consumers
			// for vanished ones and recreates them, which pushes the acked
			// messages again.
			err := e.check(msgs)
			// Deleted through the API too, which drops the index entry at
			// once; deliver's clean-up (the library) would leave it, and
			// its watcher, for a minute.
			if derr := admin.DeleteSubscription(context.Background(), &pb.DeleteSubscriptionRequest{Subscription: name}); err == nil {
				err = derr
			}
			return err
		}
	})
}

// pushEndpoint answers push requests with 204 after decoding them, and
// counts them per ordering key ("key-N", as keyed names them).
type pushEndpoint struct {
	url      string
	srv      *http.Server
	done     func()
	keys     []pushKey
	bad      atomic.Int64 // bodies that did not decode, or an unknown key
	overlaps atomic.Int64 // requests that found one of their key in flight
}

type pushKey struct{ got, busy atomic.Int64 }

func startPushEndpoint(keys int, done func()) *pushEndpoint {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	e := &pushEndpoint{url: "http://" + l.Addr().String() + "/push", done: done, keys: make([]pushKey, keys)}
	e.srv = &http.Server{Handler: e}
	go func() { _ = e.srv.Serve(l) }()
	return e
}

func (e *pushEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Message struct {
			Data        []byte `json:"data"`
			OrderingKey string `json:"orderingKey"`
		} `json:"message"`
	}
	err := json.NewDecoder(r.Body).Decode(&body)
	k, kerr := strconv.Atoi(strings.TrimPrefix(body.Message.OrderingKey, "key-"))
	if err != nil || kerr != nil || k < 0 || k >= len(e.keys) {
		// Still acked and counted, so that the run ends and check
		// reports it rather than the bench waiting on redeliveries.
		e.bad.Add(1)
		e.done()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	key := &e.keys[k]
	if key.busy.Add(1) > 1 {
		e.overlaps.Add(1)
	}
	key.got.Add(1)
	e.done()
	// Released before the answer: the key's next request can only
	// follow it.
	key.busy.Add(-1)
	w.WriteHeader(http.StatusNoContent)
}

// check says whether every key got its messages (keyed sends message i
// on key i%keys), once each and one at a time.
func (e *pushEndpoint) check(msgs int) error {
	if bad, over := e.bad.Load(), e.overlaps.Load(); bad > 0 || over > 0 {
		return fmt.Errorf("push: %d requests undecodable or of an unknown key, %d with their key already in flight", bad, over)
	}
	keys := len(e.keys)
	for k := range e.keys {
		want := int64(msgs / keys)
		if k < msgs%keys {
			want++
		}
		if got := e.keys[k].got.Load(); got != want {
			return fmt.Errorf("push: key-%d got %d messages, want %d", k, got, want)
		}
	}
	return nil
}
