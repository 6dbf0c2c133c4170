package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

const project = "observed"

func topicPath(id string) string { return "projects/" + project + "/topics/" + id }
func subPath(id string) string   { return "projects/" + project + "/subscriptions/" + id }

// startSidecar runs a sidecar with its embedded nats-server in this
// process until the test ends.
// startSidecar runs a sidecar with its embedded server; configure, if
// given, changes its configuration first.
func startSidecar(t *testing.T, configure ...func(*sidecar.Config)) sidecar.Listening {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan sidecar.Listening, 1)
	cfg := sidecar.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), Project: project, ShutdownTimeout: 2 * time.Second}
	for _, f := range configure {
		f(&cfg)
	}
	go func() { done <- sidecar.Run(ctx, cfg, nil, func(l sidecar.Listening) { ready <- l }) }()
	var at sidecar.Listening
	select {
	case at = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("sidecar ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("sidecar not ready within 30s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sidecar: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("sidecar did not stop within 30s")
		}
	})
	return at
}

// goClient is Google's Go client for the sidecar's gRPC API, as
// PUBSUB_EMULATOR_HOST sets it up.
func goClient(t *testing.T, addr string) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	if err != nil {
		t.Fatalf("pubsub.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func createTopic(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topicPath(id)}); err != nil {
		t.Fatalf("CreateTopic(%s): %v", id, err)
	}
}

func createSub(t *testing.T, c *pubsub.Client, s *pb.Subscription) {
	t.Helper()
	if _, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), s); err != nil {
		t.Fatalf("CreateSubscription(%s): %v", s.Name, err)
	}
}

// publish publishes n messages over keys keys (k0, k1, ...) and waits
// until each is stored.
func publish(t *testing.T, p *pubsub.Publisher, from, n, keys int) {
	t.Helper()
	if err := publishErr(p, from, n, keys); err != nil {
		t.Fatal(err)
	}
}

func publishErr(p *pubsub.Publisher, from, n, keys int) error {
	results := make([]*pubsub.PublishResult, n)
	for i := range n {
		results[i] = p.Publish(context.Background(), &pubsub.Message{Data: fmt.Appendf(nil, "m%d", from+i), OrderingKey: fmt.Sprintf("k%d", (from+i)%keys)})
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

// The series of /metrics, parsed by Prometheus' text parser while
// messages are published, delivered, acked, nacked and dead-lettered: each
// exists, with its labels, and moves as what happened says.
func TestMetricsUnderLoad(t *testing.T) {
	at := startSidecar(t)
	c := goClient(t, at.GRPC)
	createTopic(t, c, "load")
	createTopic(t, c, "load-dead")
	createSub(t, c, &pb.Subscription{Name: subPath("load-dead-sub"), Topic: topicPath("load-dead")})
	createSub(t, c, &pb.Subscription{Name: subPath("load-sub"), Topic: topicPath("load"), EnableMessageOrdering: true, AckDeadlineSeconds: 60,
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath("load-dead"), MaxDeliveryAttempts: 5}})
	url := "http://" + at.HTTP + "/metrics"
	sub, topic := []string{"subscription", subPath("load-sub")}, []string{"topic", topicPath("load")}

	p := c.Publisher("load")
	p.EnableMessageOrdering = true
	t.Cleanup(p.Stop)
	const first, keys = 200, 20
	publish(t, p, 0, first, keys)

	// Nothing received yet: the backlog is what was published.
	var m testutil.Metrics
	poll := func(what string, cond func(testutil.Metrics) bool) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, func() bool {
			m = testutil.Scrape(t, url)
			return cond(m)
		}, "%s; last scrape: %v", what, func() string { return describe(m) })
	}
	poll("backlog of the published messages", func(m testutil.Metrics) bool {
		v, _ := m.Value("jetorder_backlog_messages", sub...)
		age, _ := m.Value("jetorder_oldest_unacked_age_seconds", sub...)
		n, _ := m.Value("jetorder_topic_messages", topic...)
		return v == first && age > 0 && n == first
	})
	if v, _ := m.Value("jetorder_published_total", topic...); v != first {
		t.Errorf("jetorder_published_total = %v, want %d", v, first)
	}
	if v, _ := m.Value("jetorder_publish_latency_seconds", topic...); v != first {
		t.Errorf("jetorder_publish_latency_seconds count = %v, want %d", v, first)
	}

	// Load: a publisher goes on while a Go client receives. It acks every
	// message but one, the poison, which it nacks until it is
	// dead-lettered; its third delivery it holds until the test has seen
	// its key paused.
	poison := p.Publish(context.Background(), &pubsub.Message{Data: []byte("poison"), OrderingKey: "poison-key"})
	if _, err := poison.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	published := first + 1
	held, release := make(chan int, 1), make(chan struct{})
	var acked atomic.Int64
	rctx, stopReceive := context.WithCancel(context.Background())
	received := make(chan error, 1)
	go func() {
		received <- c.Subscriber("load-sub").Receive(rctx, func(_ context.Context, msg *pubsub.Message) {
			if string(msg.Data) != "poison" {
				msg.Ack()
				acked.Add(1)
				return
			}
			if a := *msg.DeliveryAttempt; a == 3 {
				held <- a
				<-release
			}
			msg.Nack()
		})
	}()
	defer func() {
		stopReceive()
		if err := <-received; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Receive: %v", err)
		}
	}()
	releasePoison := sync.OnceFunc(func() { close(release) })
	defer releasePoison() // before Receive is waited for, should the test end early
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	var loaded atomic.Int64
	loadErr := make(chan error, 1)
	load.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			if err := publishErr(p, published+i*10, 10, keys); err != nil {
				loadErr <- err
				return
			}
			loaded.Add(10)
		}
	})
	stopLoadOnce := sync.OnceFunc(func() {
		stopLoad()
		load.Wait()
	})
	defer stopLoadOnce()

	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the poison message was not delivered a third time")
	}
	// Under load: every scrape parses, every series is there with its
	// labels, and counters never go down.
	prev := testutil.Metrics{}
	scrapes := 0
	poll("the poison message's key paused at its third delivery", func(m testutil.Metrics) bool {
		checkSeries(t, m)
		checkMonotonic(t, prev, m, sub, topic)
		prev = m
		scrapes++
		paused, _ := m.Value("jetorder_paused_keys", sub...)
		attempt, _ := m.Value("jetorder_max_delivery_attempt", sub...)
		return paused == 1 && attempt >= 3 && scrapes >= 10
	})
	for name, want := range map[string]float64{"jetorder_keys_in_flight": 1, "jetorder_streaming_pull_streams": 1, "jetorder_partitions_owned": 8} {
		if v, _ := m.Value(name, sub...); v < want {
			t.Errorf("%s = %v under load, want at least %v", name, v, want)
		}
	}
	releasePoison()
	stopLoadOnce()
	select {
	case err := <-loadErr:
		t.Fatalf("publish under load: %v", err)
	default:
	}
	published += int(loaded.Load())

	// Once the load is over: every message but the poison acked, the
	// poison dead-lettered after five deliveries, and nothing left.
	poll("every message acked and the poison dead-lettered", func(m testutil.Metrics) bool {
		checkSeries(t, m)
		a, _ := m.Value("jetorder_acked_total", sub...)
		dl, _ := m.Value("jetorder_dead_lettered_total", sub...)
		backlog, ok := m.Value("jetorder_backlog_messages", sub...)
		return a == float64(published-1) && dl == 1 && ok && backlog == 0
	})
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"jetorder_published_total", topic, float64(published)},
		{"jetorder_publish_latency_seconds", topic, float64(published)},
		{"jetorder_delivered_total", sub, float64(published - 1 + 5)},
		{"jetorder_redelivered_total", sub, 4},
		{"jetorder_nacked_total", sub, 5},
		{"jetorder_acked_total", sub, float64(published - 1)},
		{"jetorder_ack_latency_seconds", sub, float64(published - 1)},
		{"jetorder_dead_lettered_total", sub, 1},
		{"jetorder_oldest_unacked_age_seconds", sub, 0},
		{"jetorder_paused_keys", sub, 0},
		{"jetorder_topic_messages", topic, float64(published)},
	} {
		if v, _ := m.Value(c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if acked.Load() < int64(published-1) {
		t.Errorf("the client acked %d, want %d", acked.Load(), published-1)
	}
}

// jetorder_partitions_unowned counts the partitions of a partitioned
// subscription that hold messages and that no receiver owns: every one
// with messages while nobody receives, none once a receiver holds them
// (unacked), with the backlog unchanged.
func TestPartitionsUnowned(t *testing.T) {
	at := startSidecar(t)
	c := goClient(t, at.GRPC)
	createTopic(t, c, "unowned")
	createSub(t, c, &pb.Subscription{Name: subPath("unowned-sub"), Topic: topicPath("unowned"), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	url := "http://" + at.HTTP + "/metrics"
	sub := []string{"subscription", subPath("unowned-sub")}

	p := c.Publisher("unowned")
	p.EnableMessageOrdering = true
	t.Cleanup(p.Stop)
	const n, keys, partitions = 10, 5, 8 // the default partition count
	publish(t, p, 0, n, keys)
	holding := map[int]bool{}
	for k := range keys {
		holding[keyrouter.Slot(fmt.Sprintf("k%d", k))%partitions] = true
	}

	var m testutil.Metrics
	poll := func(what string, cond func(unowned, owned, backlog float64) bool) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, func() bool {
			m = testutil.Scrape(t, url)
			unowned, ok1 := m.Value("jetorder_partitions_unowned", sub...)
			owned, ok2 := m.Value("jetorder_partitions_owned", sub...)
			backlog, ok3 := m.Value("jetorder_backlog_messages", sub...)
			return ok1 && ok2 && ok3 && cond(unowned, owned, backlog)
		}, "%s; last scrape: %v", what, func() string { return describe(m) })
	}
	poll(fmt.Sprintf("nobody receives: the %d partitions with messages unowned", len(holding)), func(unowned, owned, backlog float64) bool {
		return unowned == float64(len(holding)) && owned == 0 && backlog == n
	})

	// A receiver that holds each message it is handed, unacked.
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	rctx, stopReceive := context.WithCancel(context.Background())
	received := make(chan error, 1)
	go func() {
		received <- c.Subscriber("unowned-sub").Receive(rctx, func(_ context.Context, msg *pubsub.Message) {
			<-release
			msg.Ack()
		})
	}()
	defer func() {
		releaseOnce()
		stopReceive()
		if err := <-received; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Receive: %v", err)
		}
	}()
	poll("a receiver holds the messages: it owns the partitions with messages, none is unowned", func(unowned, owned, backlog float64) bool {
		return unowned == 0 && owned == float64(len(holding)) && backlog == n
	})
	releaseOnce()
	poll("every message acked", func(unowned, _, backlog float64) bool { return unowned == 0 && backlog == 0 })
}

// families are the metric families /metrics must have, with their types
// and labels (buckets' le aside).
var families = map[string]struct {
	typ    dto.MetricType
	labels []string
}{
	"jetorder_published_total":              {dto.MetricType_COUNTER, []string{"topic"}},
	"jetorder_publish_latency_seconds":      {dto.MetricType_HISTOGRAM, []string{"topic"}},
	"jetorder_topic_messages":               {dto.MetricType_GAUGE, []string{"topic"}},
	"jetorder_topic_bytes":                  {dto.MetricType_GAUGE, []string{"topic"}},
	"jetorder_delivered_total":              {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_acked_total":                  {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_nacked_total":                 {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_redelivered_total":            {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_dead_lettered_total":          {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_lease_expired_total":          {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_stream_unread_returned_total": {dto.MetricType_COUNTER, []string{"subscription"}},
	"jetorder_ack_latency_seconds":          {dto.MetricType_HISTOGRAM, []string{"subscription"}},
	"jetorder_delivery_latency_seconds":     {dto.MetricType_HISTOGRAM, []string{"subscription"}},
	"jetorder_backlog_messages":             {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_oldest_unacked_age_seconds":   {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_keys_in_flight":               {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_paused_keys":                  {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_max_delivery_attempt":         {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_outstanding_messages":         {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_partitions_owned":             {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_partitions_unowned":           {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_partition_buffered_messages":  {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_partitions_full":              {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_streaming_pull_streams":       {dto.MetricType_GAUGE, []string{"subscription"}},
	"jetorder_publish_failures_total":       {dto.MetricType_COUNTER, nil},
	"jetorder_live_consumers":               {dto.MetricType_GAUGE, nil},
	"jetorder_nats_connected":               {dto.MetricType_GAUGE, nil},
	"jetorder_jetstream_available":          {dto.MetricType_GAUGE, nil},
	// The Go runtime and process collectors.
	"go_goroutines":                 {dto.MetricType_GAUGE, nil},
	"go_memstats_heap_alloc_bytes":  {dto.MetricType_GAUGE, nil},
	"process_cpu_seconds_total":     {dto.MetricType_COUNTER, nil},
	"process_resident_memory_bytes": {dto.MetricType_GAUGE, nil},
	"process_open_fds":              {dto.MetricType_GAUGE, nil},
}

// checkSeries checks that every family of families is in m with its type
// and labels, besides the sidecar label every series has, and that no
// jetorder series has a label beyond sidecar, subscription, topic (and a
// histogram's le): none per key.
func checkSeries(t *testing.T, m testutil.Metrics) {
	t.Helper()
	for name, want := range families {
		f := m[name]
		if f == nil || len(f.GetMetric()) == 0 {
			t.Errorf("no %s in the scrape", name)
			continue
		}
		if f.GetType() != want.typ {
			t.Errorf("%s is a %v, want a %v", name, f.GetType(), want.typ)
		}
		for _, s := range f.GetMetric() {
			var got []string
			named := false
			for _, l := range s.GetLabel() {
				if l.GetName() == "sidecar" {
					named = l.GetValue() != ""
					continue
				}
				got = append(got, l.GetName())
			}
			if !named {
				t.Errorf("%s has no sidecar label", name)
			}
			if !slices.Equal(got, want.labels) {
				t.Errorf("%s has labels %v, want %v", name, got, want.labels)
			}
		}
	}
	for name, f := range m {
		if !strings.HasPrefix(name, "jetorder_") {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() != "sidecar" && l.GetName() != "subscription" && l.GetName() != "topic" {
					t.Errorf("%s has the label %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// checkMonotonic checks that the counters of sub and topic did not go down
// from prev to m.
func checkMonotonic(t *testing.T, prev, m testutil.Metrics, sub, topic []string) {
	t.Helper()
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"jetorder_published_total", topic}, {"jetorder_delivered_total", sub}, {"jetorder_acked_total", sub},
		{"jetorder_nacked_total", sub}, {"jetorder_redelivered_total", sub}, {"jetorder_ack_latency_seconds", sub},
	} {
		before, _ := prev.Value(c.name, c.labels...)
		if now, _ := m.Value(c.name, c.labels...); now < before {
			t.Errorf("%s went down from %v to %v", c.name, before, now)
		}
	}
}

// describe shows a scrape's jetorder series, for failure messages.
func describe(m testutil.Metrics) string {
	var b strings.Builder
	names := make([]string, 0, len(m))
	for name := range m {
		if strings.HasPrefix(name, "jetorder_") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		for _, s := range m.Series(name) {
			if s.Histogram != nil {
				continue
			}
			fmt.Fprintf(&b, "\n%s%v %v", name, labelPairs(s), valueOf(s))
		}
	}
	return b.String()
}

func labelPairs(s *dto.Metric) []string {
	var out []string
	for _, l := range s.GetLabel() {
		out = append(out, l.GetName()+"="+l.GetValue())
	}
	return out
}

func valueOf(s *dto.Metric) float64 {
	if s.Counter != nil {
		return s.GetCounter().GetValue()
	}
	return s.GetGauge().GetValue()
}
