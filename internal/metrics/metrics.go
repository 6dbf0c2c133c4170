// Package metrics holds the sidecar's counters, gauges and latency
// histograms and writes them in the Prometheus text exposition format
// (version 0.0.4). It has no labels, so its size does not grow with the
// number of topics, subscriptions or keys.
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Counter only goes up.
type Counter struct{ v atomic.Uint64 }

// Inc adds 1.
func (c *Counter) Inc() { c.v.Add(1) }

// Value is the current count.
func (c *Counter) Value() uint64 { return c.v.Load() }

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
	DIDCommGaps  Counter // DIDComm gaps opened, on subscriptions tracked by the sidecar

	Streams     Gauge // open StreamingPull streams
	Outstanding Gauge // messages handed to clients and not yet settled

	PublishLatency  Histogram // Publish call to stored
	DeliveryLatency Histogram // stored to handed to a client

	mu     sync.Mutex
	gauges []funcGauge
}

type funcGauge struct {
	name, help string
	fn         func() (float64, bool)
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
	counter("jetorder_didcomm_gaps_total", "DIDComm sender_order gaps opened on subscriptions the sidecar tracks.", &r.DIDCommGaps)
	gauge("jetorder_streaming_pull_streams", "Open StreamingPull streams.", float64(r.Streams.Value()))
	gauge("jetorder_outstanding_messages", "Messages handed to subscribers and not yet settled.", float64(r.Outstanding.Value()))
	r.mu.Lock()
	gauges := append([]funcGauge(nil), r.gauges...)
	r.mu.Unlock()
	for _, g := range gauges {
		if v, ok := g.fn(); ok {
			gauge(g.name, g.help, v)
		}
	}
	histogram(ew, "jetorder_publish_latency_seconds", "Time from a Publish call to the message being stored.", &r.PublishLatency)
	histogram(ew, "jetorder_delivery_latency_seconds", "Time from a message being stored to its first hand-over to a subscriber.", &r.DeliveryLatency)
	return ew.err
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
