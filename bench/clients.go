package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pubsubv1 "cloud.google.com/go/pubsub"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/internal/itest"
)

// clientsRuns measures what frameworks on Google's clients meet
// (docs/SIDECAR.md, Frameworks and clients), through the Pub/Sub API of a
// sidecar and of Google's emulator in the same round, the emulator being
// the baseline: one hot key through Google's Go clients v1 and v2 and its
// Node.js client, under strict and pipelined ordering; and five rounds of
// subscribe, read and ack 1,000, close, over 5,000 messages, unordered
// and on one key (pipelined), through the Go clients. Without the
// emulator (or Node and integration/access/node's modules) those rows are
// left out.
func (b *bench) clientsRuns() chart {
	sc := b.startSidecar()
	defer sc.stop()
	defer b.deleteTopics("clients-") // and their consumers, which the runs after would carry
	servers := []clientsServer{{name: "sidecar", addr: sc.addr, project: project}}
	if addr, cmd, err := itest.StartEmulator(); err != nil {
		fmt.Printf("clients run: no Google emulator, its figures left out: %v\n", err)
	} else {
		defer func() { _ = cmd.Process.Kill() }()
		servers = append(servers, clientsServer{name: "emulator", addr: addr, project: "bench-clients", emulator: true})
	}
	node, nodeErr := nodeHotKey()
	if nodeErr != nil {
		fmt.Printf("clients run: the Node rows left out: %v\n", nodeErr)
	}
	const hot, strictHot, perRound, cycles = 5000, 100, 1000, 5
	type figure struct {
		what   string
		values map[string][]float64 // server -> msgs/s per round
	}
	var figs []*figure
	record := func(i int, what, server string, rate float64) {
		if i == len(figs) {
			figs = append(figs, &figure{what: what, values: map[string][]float64{}})
		}
		figs[i].values[server] = append(figs[i].values[server], rate)
		fmt.Printf("      %-58s %-8s %10.0f msgs/s\n", what, server, rate)
	}
	for round := 1; round <= *rounds; round++ {
		fmt.Printf("round %d: clients (messages/s; cycles: 5,000 messages over the whole run)\n", round)
		i := 0
		for _, kind := range []string{"v2", "v1"} {
			for _, s := range servers {
				c := s.goClient(kind)
				if !s.emulator {
					record(i, "Go "+kind+", 1 key, strict ("+strconv.Itoa(strictHot)+" msgs)", s.name, s.hotKey(c, nil, strictHot))
				}
				record(i+1, "Go "+kind+", 1 key, pipelined ("+strconv.Itoa(hot)+" msgs)", s.name, s.hotKey(c, pipelinedLabel, hot))
				record(i+2, "Go "+kind+", cycles, unordered", s.name, s.cycles(c, false, cycles, perRound))
				record(i+3, "Go "+kind+", cycles, 1 key pipelined", s.name, s.cycles(c, true, cycles, perRound))
				c.close()
			}
			i += 4
		}
		if nodeErr == nil {
			for _, s := range servers {
				if !s.emulator {
					record(i, "Node, 1 key, strict (100 msgs)", s.name, node(s, nil, 100, ""))
					record(i+1, "Node, 1 key, strict, acks every 5 ms (300 msgs)", s.name, node(s, nil, 300, "5"))
				}
				record(i+2, "Node, 1 key, pipelined (5000 msgs; Node does not serialize a key)", s.name, node(s, pipelinedLabel, hot, ""))
			}
		}
	}
	c := chart{name: "clients", title: "Google's clients through the sidecar, against Google's emulator", note: "median of " + plural(*rounds, "round")}
	fmt.Printf("clients, median of %d rounds:\n", *rounds)
	for _, f := range figs {
		s := median(f.values["sidecar"])
		g := barGroup{title: f.what + ": messages/s"}
		if len(f.values["emulator"]) > 0 {
			e := median(f.values["emulator"])
			fmt.Printf("  %-58s sidecar %10.0f msgs/s  emulator %10.0f  %6.2fx\n", f.what, s, e, s/e)
			g.bars = []bar{baseBar("Google's emulator", e), rateBar("sidecar", s, vs(s/e, "emulator"))}
		} else {
			fmt.Printf("  %-58s sidecar %10.0f msgs/s  (the emulator does not wait for acks: no strict ordering)\n", f.what, s)
			g.bars = []bar{rateBar("sidecar", s)}
		}
		c.groups = append(c.groups, g)
	}
	return c
}

var pipelinedLabel = map[string]string{"jetorder-ordering": "pipelined"}

// clientsServer is a Pub/Sub API server the clients run talks to.
type clientsServer struct {
	name, addr, project string
	emulator            bool
}

var clientsIDs atomic.Int64

// subscription makes a topic and a subscription on s (ordered when
// labels is not nil, or ordered says so) and returns their ids.
func (s clientsServer) subscription(ordered bool, labels map[string]string) (topic, sub string) {
	c, err := pubsub.NewClient(context.Background(), s.project, clientOptions(s.addr)...)
	check(err)
	defer c.Close()
	id := fmt.Sprintf("clients-%d", clientsIDs.Add(1))
	ctx := context.Background()
	_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/" + s.project + "/topics/" + id})
	check(err)
	_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: "projects/" + s.project + "/subscriptions/" + id + "-sub",
		Topic: "projects/" + s.project + "/topics/" + id, EnableMessageOrdering: ordered || labels != nil, Labels: labels})
	check(err)
	return id, id + "-sub"
}

func clientOptions(addr string) []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled()}
}

// benchClient is one of Google's Go clients with its default settings.
type benchClient struct {
	publish func(topic, key string, n int)
	// receive runs Receive on sub; f gets each message's index and its
	// ack and nack.
	receive func(ctx context.Context, sub string, f func(ctx context.Context, index int, ack, nack func())) error
	close   func()
}

func (s clientsServer) goClient(kind string) benchClient {
	index := func(data []byte) int {
		i, err := strconv.Atoi(string(data))
		check(err)
		return i
	}
	if kind == "v1" {
		c, err := pubsubv1.NewClient(context.Background(), s.project, clientOptions(s.addr)...)
		check(err)
		return benchClient{
			publish: func(topic, key string, n int) {
				t := c.Topic(topic)
				t.EnableMessageOrdering = true
				defer t.Stop()
				rs := make([]*pubsubv1.PublishResult, n)
				for i := range n {
					rs[i] = t.Publish(context.Background(), &pubsubv1.Message{Data: []byte(strconv.Itoa(i)), OrderingKey: key})
				}
				for _, r := range rs {
					_, err := r.Get(context.Background())
					check(err)
				}
			},
			receive: func(ctx context.Context, sub string, f func(context.Context, int, func(), func())) error {
				return c.Subscription(sub).Receive(ctx, func(ctx context.Context, m *pubsubv1.Message) { f(ctx, index(m.Data), m.Ack, m.Nack) })
			},
			close: func() { _ = c.Close() },
		}
	}
	c, err := pubsub.NewClient(context.Background(), s.project, clientOptions(s.addr)...)
	check(err)
	return benchClient{
		publish: func(topic, key string, n int) {
			p := c.Publisher(topic)
			p.EnableMessageOrdering = true
			defer p.Stop()
			rs := make([]*pubsub.PublishResult, n)
			for i := range n {
				rs[i] = p.Publish(context.Background(), &pubsub.Message{Data: []byte(strconv.Itoa(i)), OrderingKey: key})
			}
			for _, r := range rs {
				_, err := r.Get(context.Background())
				check(err)
			}
		},
		receive: func(ctx context.Context, sub string, f func(context.Context, int, func(), func())) error {
			return c.Subscriber(sub).Receive(ctx, func(ctx context.Context, m *pubsub.Message) { f(ctx, index(m.Data), m.Ack, m.Nack) })
		},
		close: func() { _ = c.Close() },
	}
}

// clientsCap bounds one measurement: past it the rate is reported as of
// the messages acked by then.
const clientsCap = 2 * time.Minute

// acked counts the distinct messages acked, and closes all once there
// are n.
type acked struct {
	mu   sync.Mutex
	seen map[int]bool
	n    int
	all  chan struct{}
}

func newAcked(n int) *acked { return &acked{seen: map[int]bool{}, n: n, all: make(chan struct{})} }

func (a *acked) add(i int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seen[i] {
		a.seen[i] = true
		if len(a.seen) == a.n {
			close(a.all)
		}
	}
}

func (a *acked) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seen)
}

// wait waits until every message is acked or the cap passes, and returns
// the rate since start.
func (a *acked) wait(start time.Time) float64 {
	select {
	case <-a.all:
	case <-time.After(clientsCap - time.Since(start)):
		fmt.Printf("      (cut short after %v: %d of %d acked)\n", clientsCap, a.count(), a.n)
	}
	return float64(a.count()) / time.Since(start).Seconds()
}

// hotKey publishes n messages of one key and times receiving them all,
// each acked at once in its handler.
func (s clientsServer) hotKey(c benchClient, labels map[string]string, n int) float64 {
	topic, sub := s.subscription(true, labels)
	c.publish(topic, "hot", n)
	a := newAcked(n)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- c.receive(ctx, sub, func(_ context.Context, i int, ack, _ func()) { ack(); a.add(i) })
	}()
	rate := a.wait(start)
	cancel()
	check(<-done)
	return rate
}

// cycles times rounds of a framework's subscriber (each message handed to
// the application through an unbuffered channel, nacked if Receive is
// cancelled first) reading and acking perRound messages and closing, then
// one more reading the rest: rounds*perRound messages, unordered or on
// one key with pipelined ordering.
func (s clientsServer) cycles(c benchClient, ordered bool, rounds, perRound int) float64 {
	var labels map[string]string
	key := ""
	if ordered {
		labels, key = pipelinedLabel, "hot"
	}
	topic, sub := s.subscription(false, labels)
	c.publish(topic, key, rounds*perRound)
	a := newAcked(rounds * perRound)
	start := time.Now()
	subscriber := func(read int) {
		type app struct {
			index int
			ack   chan struct{}
		}
		out := make(chan app)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- c.receive(ctx, sub, func(ctx context.Context, i int, ack, nack func()) {
				m := app{i, make(chan struct{})}
				select {
				case out <- m:
				case <-ctx.Done():
					nack()
					return
				}
				select {
				case <-m.ack:
					ack()
				case <-ctx.Done():
					nack()
				}
			})
		}()
		deadline := time.After(clientsCap - time.Since(start))
	reading:
		for got := 0; got < read; {
			select {
			case m := <-out:
				close(m.ack)
				a.add(m.index)
				got++
			case <-a.all:
				break reading
			case <-deadline:
				break reading
			}
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			check(err)
		}
	}
	for range rounds {
		subscriber(perRound)
	}
	subscriber(rounds * perRound) // the rest, until every message is acked
	return a.wait(start)
}

// nodeHotKey returns what runs integration/access/node/hotkey.mjs (Google's
// Node.js client on one hot key) against a server, or why it cannot run.
func nodeHotKey() (func(s clientsServer, labels map[string]string, n int, ackMaxMs string) float64, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("node is not installed")
	}
	dir := filepath.Join("integration", "access", "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@google-cloud", "pubsub")); err != nil {
		return nil, errors.New("Google's Node client is not installed: make node-deps")
	}
	return func(s clientsServer, labels map[string]string, n int, ackMaxMs string) float64 {
		topic, sub := s.subscription(true, labels)
		cmd := exec.Command(node, "hotkey.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PUBSUB_EMULATOR_HOST="+s.addr, "JETORDER_PROJECT="+s.project, "JETORDER_TOPIC="+topic,
			"JETORDER_SUBSCRIPTION="+sub, "JETORDER_MESSAGES="+strconv.Itoa(n), "JETORDER_HOLD_MS=0", "METADATA_SERVER_DETECTION=none")
		if ackMaxMs != "" {
			cmd.Env = append(cmd.Env, "JETORDER_ACK_MAX_MS="+ackMaxMs)
		}
		out, err := cmd.Output()
		if err != nil {
			check(fmt.Errorf("node hotkey.mjs: %w\n%s", err, out))
		}
		var r struct {
			Received []int   `json:"received"`
			Seconds  float64 `json:"seconds"`
		}
		check(json.Unmarshal(out, &r))
		return float64(n) / r.Seconds
	}, nil
}

// deleteTopics deletes the bench project's topics and subscriptions whose
// ids start with prefix.
func (b *bench) deleteTopics(prefix string) {
	ctx := context.Background()
	subs, err := b.client.Subscriptions(ctx)
	check(err)
	for _, s := range subs {
		if strings.HasPrefix(s.ID(), prefix) {
			check(s.Delete(ctx))
		}
	}
	topics, err := b.client.Topics(ctx)
	check(err)
	for _, t := range topics {
		if strings.HasPrefix(t.ID(), prefix) {
			check(t.Delete(ctx))
		}
	}
}
