package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Server restarts while four keys publish as fast as they can, so batches
// of many messages of a key are cut by the drop. Each key's stored
// messages must be 0, 1, 2, ... with no gap. With nats.go's reconnect
// buffer (which NewClient refuses) this failed: the messages written just
// before the drop were lost with the socket while the later ones, buffered,
// were stored after the reconnect.
func TestFaultReconnectMidBatch(t *testing.T) {
	dir := t.TempDir()
	srv := testutil.ServerAt(t, dir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	nc := testutil.Connect(t, srv.ClientURL())
	client, err := adapter.NewClient(nc, project)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	topic, err := client.CreateTopic(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	const cycles, keys = 6, 4
	for cycle := range cycles {
		// Fresh keys each cycle: a key paused by the last restart stays so.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var published sync.WaitGroup
		for k := range keys {
			key := fmt.Sprintf("hot-%d-%d", cycle, k)
			wg.Add(1)
			published.Add(1)
			go func() {
				defer wg.Done()
				var out []*adapter.PublishResult
				for i := 0; ; i++ {
					select {
					case <-stop:
						for _, r := range out {
							<-r.Ready()
						}
						return
					default:
					}
					out = append(out, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
					if i == 300 {
						published.Done()
					}
					if len(out) > 300 { // bounded backlog: batches of up to 100 stay in flight
						<-out[0].Ready()
						out = out[1:]
					}
				}
			}()
		}
		published.Wait()
		srv.Shutdown()
		testutil.Eventually(t, 10*time.Second, func() bool { return !nc.IsConnected() }, "client still connected")
		srv = testutil.ServerAt(t, dir, port)
		testutil.Eventually(t, 10*time.Second, nc.IsConnected, "client not reconnected")
		close(stop)
		wg.Wait()
	}

	// Each key's stored messages must be 0, 1, 2, ... with no gap: a
	// message that was not stored pauses its key, so nothing after it may
	// be stored either.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.Stream(ctx, keyrouter.StreamName(project, "hot"))
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	gaps := 0
	for seq := uint64(1); seq <= str.CachedInfo().State.LastSeq; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if idx != next[key] {
			gaps++
			t.Errorf("key %s: message %d stored where %d was due (stream sequence %d)", key, idx, next[key], seq)
		}
		next[key] = idx + 1
	}
	t.Logf("%d messages over %d keys, %d gaps", str.CachedInfo().State.Msgs, len(next), gaps)
}

// NewClient refuses a connection that buffers publishes while reconnecting,
// and names the option that fixes it.
func TestNewClientRefusesReconnectBuffer(t *testing.T) {
	srv := testutil.Server(t)
	buffered, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer buffered.Close()
	if _, err := adapter.NewClient(buffered, project); !errors.Is(err, adapter.ErrInvalidConfig) || !strings.Contains(err.Error(), "nats.ReconnectBufSize(-1)") {
		t.Fatalf("NewClient over a buffering connection: %v, want ErrInvalidConfig naming nats.ReconnectBufSize(-1)", err)
	}
	for name, opt := range map[string]nats.Option{"unbuffered": nats.ReconnectBufSize(-1), "no reconnects": nats.NoReconnect()} {
		nc, err := nats.Connect(srv.ClientURL(), opt)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := adapter.NewClient(nc, project); err != nil {
			t.Errorf("NewClient over a connection with %s: %v", name, err)
		}
	}
}

// A subscription's configuration read whose reply the connection loses is
// asked again, not waited for until the caller's deadline. A sidecar that
// does not receive a subscription reads its configuration for a client's
// Acknowledge with the call's deadline (Google's Go client gives it a
// minute, and sends no other ack until it returns): after a fault, a
// request the cluster left unanswered held one client's acks for up to
// that minute, and every key whose messages that client held waited.
func TestFaultConfigReadAskedAgain(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("cfg")
	e.createSub("cfg-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	proxy, err := faultproxy.Start(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	client, err := adapter.NewClient(testutil.Connect(t, proxy.URL()), project, testLogger()...)
	if err != nil {
		t.Fatal(err)
	}
	sub := client.Subscription("cfg-sub")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sub.Config(ctx); err != nil { // the buckets open: what is lost next is the read itself
		t.Fatal(err)
	}
	proxy.HoldReplies()
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := sub.Config(ctx)
		done <- err
	}()
	// The request is at the server, its reply held, and then lost with
	// the connection.
	testutil.Eventually(t, 10*time.Second, proxy.HeldBack, "no reply held back: the read's request never reached the server")
	proxy.Cut()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Config after the lost reply: %v", err)
		}
		t.Logf("Config answered %v after it began, the reply of its first request lost", time.Since(began).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("Config still waits 15s after its request's reply was lost: it waits for the caller's deadline instead of asking again")
	}
}
