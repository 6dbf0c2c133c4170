// Package metrics holds the sidecar's counters, gauges and latency
// histograms and writes them in the Prometheus text exposition format
// (version 0.0.4). Most have no labels, so their size does not grow with
// the number of topics, subscriptions or keys; the DIDComm ones have a
// subscription label, for the subscriptions the sidecar tracks.
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Counter only goes up.
type Counter struct{ v atomic.Uint64 }

// Inc adds 1.
func (c *Counter) Inc() { c.v.Add(1) }

// Add adds n.
func (c *Counter) Add(n uint64) { c.v.Add(n) }

// Value is the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

// PerSubscription is a counter per subscription, written with a
// subscription label. Only subscriptions that counted something appear.
type PerSubscription struct {
	mu sync.Mutex
	m  map[string]*Counter
}

// Add adds n to sub's counter.
func (p *PerSubscription) Add(sub string, n uint64) {
	p.mu.Lock()
	c := p.m[sub]
	if c == nil {
		if p.m == nil {
			p.m = make(map[string]*Counter)
		}
		c = &Counter{}
		p.m[sub] = c
	}
	p.mu.Unlock()
	c.Add(n)
}

// Value is sub's count.
func (p *PerSubscription) Value(sub string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.m[sub]; c != nil {
		return c.Value()
	}
	return 0
}

func (p *PerSubscription) values() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]float64, len(p.m))
	for sub, c := range p.m {
		out[sub] = float64(c.Value())
	}
	return out
}

// Gauge goes up and down.
type Gauge struct{ v atomic.Int64 }

// Add adds n (which may be negative).
func (g *Gauge) Add(n int64) { g.v.Add(n) }

// Value is the current value.
func (g *Gauge) Value() int64 { return g.v.Load() }

// latencyBounds are the histogram buckets' upper bounds, in seconds: 100 µs
// to 60 s.
var latencyBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Histogram counts durations into latency buckets.
type Histogram struct {
	mu     sync.Mutex
	counts [19]uint64 // one per bound, then +Inf
	sum    float64
	n      uint64
}

// Observe records d.
func (h *Histogram) Observe(d time.Duration) {
	s := d.Seconds()
	if s < 0 {
		s = 0
	}
	i := sort.SearchFloat64s(latencyBounds, s)
	h.mu.Lock()
	h.counts[i]++
	h.sum += s
	h.n++
	h.mu.Unlock()
}

// Registry is the sidecar's set of metrics.
type Registry struct {
	Published    Counter // messages stored by Publish (gRPC and HTTP)
	PublishFails Counter // messages whose publish failed
	Delivered    Counter // messages handed to clients, redeliveries included
	Redelivered  Counter // deliveries with an attempt number above 1
	Acked        Counter
	Nacked       Counter // nacks by clients (ModifyAckDeadline 0) and leases handed back at shutdown
	Expired      Counter // leases that ran out without ack or extension
	DeadLettered Counter // messages moved to a dead-letter topic
	// Ack ids: those refused (not issued by the sidecars of this server for
	// the subscription), and acks of an earlier process's ack ids honoured.
	AckIDsRefused Counter
	StaleAcks     Counter

	// DIDComm tracking by the sidecar, in sender orders (the unit of
	// received_orders' gaps), per subscription.
	DIDCommGapsOpened  PerSubscription // orders found missing
	DIDCommGapsFilled  PerSubscription // missing orders that arrived
	DIDCommGapsGivenUp PerSubscription // missing orders no longer tracked (too many gaps)
	DIDCommCopies      PerSubscription // copies of handled messages acked and dropped

	PushFailures PerSubscription // push requests that were not acked (each nacks its message)

	Streams     Gauge // open StreamingPull streams
	Outstanding Gauge // messages handed to clients and not yet settled

	PublishLatency  Histogram // Publish call to stored
	DeliveryLatency Histogram // stored to handed to a client

	mu        sync.Mutex
	gauges    []funcGauge
	subGauges []subGauge
}

type funcGauge struct {
	name, help string
	fn         func() (float64, bool)
}

type subGauge struct {
	name, help string
	fn         func() map[string]float64
}

// SubscriptionGauge adds a gauge per subscription whose values fn computes
// at each scrape, keyed by subscription name.
func (r *Registry) SubscriptionGauge(name, help string, fn func() map[string]float64) {
	r.mu.Lock()
	r.subGauges = append(r.subGauges, subGauge{name, help, fn})
	r.mu.Unlock()
}

// GaugeFunc adds a gauge whose value fn computes at each scrape; a false
// second result leaves the gauge out of that scrape.
func (r *Registry) GaugeFunc(name, help string, fn func() (float64, bool)) {
	r.mu.Lock()
	r.gauges = append(r.gauges, funcGauge{name, help, fn})
	r.mu.Unlock()
}

// Write writes every metric in the Prometheus text format.
func (r *Registry) Write(w io.Writer) error {
	ew := &errWriter{w: w}
	counter := func(name, help string, c *Counter) {
		ew.printf("# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, c.Value())
	}
	gauge := func(name, help string, v float64) {
		ew.printf("# HELP %s %s\n# TYPE %s gauge\n%s %s\n", name, help, name, name, formatFloat(v))
	}
	counter("jetorder_published_total", "Messages stored through Publish (gRPC and HTTP).", &r.Published)
	counter("jetorder_publish_failures_total", "Messages whose publish failed.", &r.PublishFails)
	counter("jetorder_delivered_total", "Messages handed to subscribers, redeliveries included.", &r.Delivered)
	counter("jetorder_redelivered_total", "Deliveries of a message delivered before.", &r.Redelivered)
	counter("jetorder_acked_total", "Messages acknowledged by subscribers.", &r.Acked)
	counter("jetorder_nacked_total", "Messages handed back: nacked by subscribers (ModifyAckDeadline 0) or at shutdown.", &r.Nacked)
	counter("jetorder_lease_expired_total", "Messages whose ack deadline passed without ack or extension.", &r.Expired)
	counter("jetorder_dead_lettered_total", "Messages moved to their subscription's dead-letter topic after the maximum delivery attempts.", &r.DeadLettered)
	counter("jetorder_ack_ids_refused_total", "Ack ids in Acknowledge, ModifyAckDeadline and StreamingPull requests that the sidecars of this NATS server did not issue for the subscription: ignored, and the request fails once the others are applied.", &r.AckIDsRefused)
	counter("jetorder_stale_acks_total", "Acks of ack ids issued by an earlier process (a sidecar that restarted) applied to the message they name.", &r.StaleAcks)
	gauge("jetorder_streaming_pull_streams", "Open StreamingPull streams.", float64(r.Streams.Value()))
	gauge("jetorder_outstanding_messages", "Messages handed to subscribers and not yet settled.", float64(r.Outstanding.Value()))
	r.mu.Lock()
	gauges := append([]funcGauge(nil), r.gauges...)
	subGauges := append([]subGauge(nil), r.subGauges...)
	r.mu.Unlock()
	for _, g := range gauges {
		if v, ok := g.fn(); ok {
			gauge(g.name, g.help, v)
		}
	}
	perSub(ew, "jetorder_didcomm_gaps_opened_total", "counter", "DIDComm sender orders found missing on subscriptions the sidecar tracks.", r.DIDCommGapsOpened.values())
	perSub(ew, "jetorder_didcomm_gaps_filled_total", "counter", "Missing DIDComm sender orders that arrived late.", r.DIDCommGapsFilled.values())
	perSub(ew, "jetorder_didcomm_gaps_given_up_total", "counter", "Missing DIDComm sender orders no longer tracked: more gap ranges than the tracker keeps per sender.", r.DIDCommGapsGivenUp.values())
	perSub(ew, "jetorder_didcomm_copies_dropped_total", "counter", "Copies of DIDComm messages already handled, acked and dropped by the sidecar.", r.DIDCommCopies.values())
	perSub(ew, "jetorder_push_failures_total", "counter", "Push requests the endpoint did not ack (an error status, a timeout, a refused connection): each nacks its message.", r.PushFailures.values())
	for _, g := range subGauges {
		perSub(ew, g.name, "gauge", g.help, g.fn())
	}
	histogram(ew, "jetorder_publish_latency_seconds", "Time from a Publish call to the message being stored.", &r.PublishLatency)
	histogram(ew, "jetorder_delivery_latency_seconds", "Time from a message being stored to its first hand-over to a subscriber.", &r.DeliveryLatency)
	return ew.err
}

// perSub writes one value per subscription, in name order; nothing when
// there is none.
func perSub(ew *errWriter, name, typ, help string, values map[string]float64) {
	if len(values) == 0 {
		return
	}
	ew.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	subs := make([]string, 0, len(values))
	for sub := range values {
		subs = append(subs, sub)
	}
	sort.Strings(subs)
	for _, sub := range subs {
		ew.printf("%s{subscription=%s} %s\n", name, labelValue(sub), formatFloat(values[sub]))
	}
}

// labelValue quotes a label value as the text format wants it.
func labelValue(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

func histogram(ew *errWriter, name, help string, h *Histogram) {
	h.mu.Lock()
	counts, sum, n := h.counts, h.sum, h.n
	h.mu.Unlock()
	ew.printf("# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, b := range latencyBounds {
		cum += counts[i]
		ew.printf("%s_bucket{le=\"%s\"} %d\n", name, formatFloat(b), cum)
	}
	ew.printf("%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n", name, n, name, formatFloat(sum), name, n)
}

func formatFloat(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
