// Package metrics holds the sidecar's Prometheus metrics
// (github.com/prometheus/client_golang) in a registry of its own, not the
// global default, so that several sidecars can run in one process (tests).
// The Go runtime and process collectors are registered on it.
//
// Series carry a subscription or topic label (full names,
// projects/P/subscriptions/S and projects/P/topics/T) and never an ordering
// key, so their number follows the subscriptions and topics that exist:
// Retain drops the series of those that are gone.
package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// latencyBuckets are the latency histograms' upper bounds, in seconds:
// 100 µs to 60 s.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Registry is one sidecar's metrics. It is safe for concurrent use.
type Registry struct {
	reg  *prometheus.Registry
	wrap prometheus.Registerer // reg, adding the sidecar label

	// Without labels.
	PublishFails  prometheus.Counter // messages whose publish failed
	AckIDsRefused prometheus.Counter // ack ids not issued for the subscription by the sidecars of this server
	StaleAcks     prometheus.Counter // acks of an earlier process's ack ids honoured

	published      *prometheus.CounterVec
	publishLatency *prometheus.HistogramVec

	delivered, redelivered, acked, nacked, expired, unread, deadLettered *prometheus.CounterVec
	deliveryLatency, ackLatency                                          *prometheus.HistogramVec
	pushFailures                                                         *prometheus.CounterVec
	didcommOpened, didcommFilled, didcommGivenUp, didcommCopies          *prometheus.CounterVec

	mu     sync.Mutex
	subs   map[string]*Subscription
	topics map[string]*Topic
	// missing are the names the last Retain did not keep: they go if the
	// next one does not keep them either.
	missingSubs, missingTopics map[string]bool
}

// Subscription is the counters and histograms of one subscription: handles
// that a hot path keeps, instead of looking the labels up each time.
type Subscription struct {
	Delivered    prometheus.Counter  // messages handed to clients, redeliveries included
	Redelivered  prometheus.Counter  // deliveries with an attempt above 1
	Acked        prometheus.Counter  // acked by clients
	Nacked       prometheus.Counter  // nacked (ModifyAckDeadline 0) or handed back
	Expired      prometheus.Counter  // leases whose deadline passed
	Unread       prometheus.Counter  // handed back when their stream ended unconfirmed
	DeadLettered prometheus.Counter  // moved to the dead-letter topic
	DeliveryLat  prometheus.Observer // stored to first hand-over, seconds
	AckLat       prometheus.Observer // hand-over to ack, seconds
}

// Topic is the counters and histograms of one topic.
type Topic struct {
	Published  prometheus.Counter  // messages stored through Publish
	PublishLat prometheus.Observer // Publish call to stored, seconds
}

// New returns a registry with every metric of this package, and the Go
// runtime and process collectors, registered.
func New() *Registry { return NewFor("") }

// NewFor is New for the sidecar named sidecar: every series carries the
// label sidecar="<name>", so that the series of several sidecars stay
// apart where they are gathered together. "" adds no label.
func NewFor(sidecar string) *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), subs: map[string]*Subscription{}, topics: map[string]*Topic{}}
	r.wrap = r.reg
	if sidecar != "" {
		r.wrap = prometheus.WrapRegistererWith(prometheus.Labels{"sidecar": sidecar}, r.reg)
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		r.wrap.MustRegister(c)
		return c
	}
	vec := func(name, label, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
		r.wrap.MustRegister(c)
		return c
	}
	histogram := func(name, label, help string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets}, []string{label})
		r.wrap.MustRegister(h)
		return h
	}
	r.PublishFails = counter("jetorder_publish_failures_total", "Messages whose publish failed.")
	r.AckIDsRefused = counter("jetorder_ack_ids_refused_total", "Ack ids in Acknowledge, ModifyAckDeadline and StreamingPull requests that the sidecars of this NATS server did not issue for the subscription: ignored, and the request fails once the others are applied.")
	r.StaleAcks = counter("jetorder_stale_acks_total", "Acks of ack ids issued by an earlier process (a sidecar that restarted) applied to the message they name.")

	r.published = vec("jetorder_published_total", "topic", "Messages stored through Publish (gRPC and HTTP).")
	r.publishLatency = histogram("jetorder_publish_latency_seconds", "topic", "Time from a Publish call to the message being stored.")

	r.delivered = vec("jetorder_delivered_total", "subscription", "Messages handed to subscribers, redeliveries included.")
	r.redelivered = vec("jetorder_redelivered_total", "subscription", "Deliveries of a message delivered before.")
	r.acked = vec("jetorder_acked_total", "subscription", "Messages acknowledged by subscribers.")
	r.nacked = vec("jetorder_nacked_total", "subscription", "Messages handed back: nacked by subscribers (ModifyAckDeadline 0) or at shutdown.")
	r.expired = vec("jetorder_lease_expired_total", "subscription", "Messages whose ack deadline passed without ack or extension.")
	r.unread = vec("jetorder_stream_unread_returned_total", "subscription", "Messages handed back when the StreamingPull stream they went out on ended before its client confirmed them (also counted as nacked).")
	r.deadLettered = vec("jetorder_dead_lettered_total", "subscription", "Messages moved to their subscription's dead-letter topic after the maximum delivery attempts.")
	r.pushFailures = vec("jetorder_push_failures_total", "subscription", "Push requests the endpoint did not ack (an error status, a timeout, a refused connection): each nacks its message.")
	r.deliveryLatency = histogram("jetorder_delivery_latency_seconds", "subscription", "Time from a message being stored to its first hand-over to a subscriber.")
	r.ackLatency = histogram("jetorder_ack_latency_seconds", "subscription", "Time from a message's hand-over to a subscriber to its ack.")
	r.didcommOpened = vec("jetorder_didcomm_gaps_opened_total", "subscription", "DIDComm sender orders found missing on subscriptions the sidecar tracks.")
	r.didcommFilled = vec("jetorder_didcomm_gaps_filled_total", "subscription", "Missing DIDComm sender orders that arrived late.")
	r.didcommGivenUp = vec("jetorder_didcomm_gaps_given_up_total", "subscription", "Missing DIDComm sender orders no longer tracked: more gap ranges than the tracker keeps per sender.")
	r.didcommCopies = vec("jetorder_didcomm_copies_dropped_total", "subscription", "Copies of DIDComm messages already handled, acked and dropped by the sidecar.")

	r.wrap.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Register adds a collector, such as the sidecar's gauges, which are
// computed at each scrape.
func (r *Registry) Register(c prometheus.Collector) error { return r.wrap.Register(c) }

// Handler serves the registry in the format the scraper asks for: the
// Prometheus text format (version 0.0.4) by default.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// Gatherer is the registry, for tests and tools that read it directly.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Subscription returns the handles of subscription name's series,
// creating them on first use.
func (r *Registry) Subscription(name string) *Subscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.subs[name]; s != nil {
		return s
	}
	s := &Subscription{
		Delivered:    r.delivered.WithLabelValues(name),
		Redelivered:  r.redelivered.WithLabelValues(name),
		Acked:        r.acked.WithLabelValues(name),
		Nacked:       r.nacked.WithLabelValues(name),
		Expired:      r.expired.WithLabelValues(name),
		Unread:       r.unread.WithLabelValues(name),
		DeadLettered: r.deadLettered.WithLabelValues(name),
		DeliveryLat:  r.deliveryLatency.WithLabelValues(name),
		AckLat:       r.ackLatency.WithLabelValues(name),
	}
	r.subs[name] = s
	return s
}

// PushFailed counts a push request of subscription sub that its endpoint
// did not ack. The series appears with the first failure.
func (r *Registry) PushFailed(sub string) {
	r.Subscription(sub) // so that Retain knows the name
	r.pushFailures.WithLabelValues(sub).Inc()
}

// DIDComm counts what DIDComm tracking saw on subscription sub, in sender
// orders: gaps opened, filled and given up, and copies dropped. The series
// appear with the first count.
func (r *Registry) DIDComm(sub string, opened, filled, givenUp, copies uint64) {
	r.Subscription(sub)
	for _, c := range []struct {
		vec *prometheus.CounterVec
		n   uint64
	}{{r.didcommOpened, opened}, {r.didcommFilled, filled}, {r.didcommGivenUp, givenUp}, {r.didcommCopies, copies}} {
		if c.n > 0 {
			c.vec.WithLabelValues(sub).Add(float64(c.n))
		}
	}
}

// Topic returns the handles of topic name's series, creating them on
// first use.
func (r *Registry) Topic(name string) *Topic {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.topics[name]; t != nil {
		return t
	}
	t := &Topic{Published: r.published.WithLabelValues(name), PublishLat: r.publishLatency.WithLabelValues(name)}
	r.topics[name] = t
	return t
}

// Retain drops the series of the subscriptions and topics for which keep
// says false in this call and in the one before: they are gone. Two calls,
// because one that is created while its caller lists them may be missing
// from the list. Handles kept from before count nowhere once dropped.
func (r *Registry) Retain(keepSub, keepTopic func(name string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	missing := make(map[string]bool)
	for name := range r.subs {
		if keepSub(name) {
			continue
		}
		if !r.missingSubs[name] {
			missing[name] = true
			continue
		}
		delete(r.subs, name)
		for _, v := range []interface{ DeleteLabelValues(...string) bool }{
			r.delivered, r.redelivered, r.acked, r.nacked, r.expired, r.unread, r.deadLettered, r.pushFailures,
			r.deliveryLatency, r.ackLatency, r.didcommOpened, r.didcommFilled, r.didcommGivenUp, r.didcommCopies,
		} {
			v.DeleteLabelValues(name)
		}
	}
	r.missingSubs = missing
	missing = make(map[string]bool)
	for name := range r.topics {
		if keepTopic(name) {
			continue
		}
		if !r.missingTopics[name] {
			missing[name] = true
			continue
		}
		delete(r.topics, name)
		r.published.DeleteLabelValues(name)
		r.publishLatency.DeleteLabelValues(name)
	}
	r.missingTopics = missing
}
