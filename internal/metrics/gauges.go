package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetorder/jetorder/internal/status"
)

// maxJetStreamAge is how old the figures read from JetStream (backlog,
// oldest unacked, topics, consumers) may be and still be exported: older
// ones (JetStream has not answered since) are left out of the scrape
// rather than shown as if current.
const maxJetStreamAge = 10 * time.Second

// gauges are the sidecar's gauges, computed at each scrape from the status
// the sidecar keeps (status.Status): per subscription and topic, and a few
// of the whole sidecar.
type gauges struct {
	get func() *status.Status

	backlog, oldest, keys, paused, maxAttempt, outstanding, streams *prometheus.Desc
	owned, unowned, buffered, full, openGaps                        *prometheus.Desc
	topicMessages, topicBytes                                       *prometheus.Desc
	consumers, natsConnected, jetStreamUp                           *prometheus.Desc
}

// RegisterStatus registers the gauges computed from the sidecar's status,
// which get returns (nil: nothing to report) at each scrape. get must be
// cheap: it is called once per scrape.
func (r *Registry) RegisterStatus(get func() *status.Status) error {
	sub := []string{"subscription"}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return r.wrap.Register(&gauges{
		get:         get,
		backlog:     desc("jetorder_backlog_messages", "Messages of the subscription not yet acked, delivered or not, as its JetStream consumers count them (read at most once a second).", sub),
		oldest:      desc("jetorder_oldest_unacked_age_seconds", "Age of the subscription's oldest message not yet acked; 0 when there is none.", sub),
		keys:        desc("jetorder_keys_in_flight", "Ordering keys with a message held by this sidecar (with a client or waiting for one).", sub),
		paused:      desc("jetorder_paused_keys", "Ordering keys whose message held by this sidecar has been delivered 3 times or more without an ack: each holds back its key.", sub),
		maxAttempt:  desc("jetorder_max_delivery_attempt", "The highest delivery attempt among messages held by this sidecar: a message that keeps failing (without a dead-letter policy its key waits) shows as a number that keeps growing.", sub),
		outstanding: desc("jetorder_outstanding_messages", "Messages handed to subscribers and not yet settled.", sub),
		streams:     desc("jetorder_streaming_pull_streams", "Open StreamingPull streams, by the subscription they attached to (\"\": none yet).", sub),
		owned:       desc("jetorder_partitions_owned", "Partitions of the partitioned subscription this sidecar owns.", sub),
		unowned:     desc("jetorder_partitions_unowned", "Partitions of the partitioned subscription holding messages that no receiver owns (JetStream has pinned none to them): nobody delivers them. The same on every sidecar (read from JetStream).", sub),
		buffered:    desc("jetorder_partition_buffered_messages", "Unacked messages owned partitions hold: with a client, or waiting behind an earlier message of their key.", sub),
		full:        desc("jetorder_partitions_full", "Owned partitions whose buffer is full: nothing more of them is delivered, for any key, until a message is acked (a key that never acks ends there).", sub),
		openGaps:    desc("jetorder_didcomm_open_gaps", "DIDComm sender orders missing in the threads this sidecar's tracker holds, per tracked subscription being received.", sub),

		topicMessages: desc("jetorder_topic_messages", "Messages the topic's stream holds.", []string{"topic"}),
		topicBytes:    desc("jetorder_topic_bytes", "Bytes the topic's stream holds.", []string{"topic"}),
		consumers:     desc("jetorder_live_consumers", "JetStream consumers in the account (per-key consumers follow the active keys).", nil),
		natsConnected: desc("jetorder_nats_connected", "1 while the sidecar's NATS connection is connected, else 0.", nil),
		jetStreamUp:   desc("jetorder_jetstream_available", "1 when the sidecar's last read of JetStream succeeded, else 0.", nil),
	})
}

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.backlog, g.oldest, g.keys, g.paused, g.maxAttempt, g.outstanding, g.streams,
		g.owned, g.unowned, g.buffered, g.full, g.openGaps, g.topicMessages, g.topicBytes, g.consumers, g.natsConnected, g.jetStreamUp} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	st := g.get()
	if st == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(g.natsConnected, boolValue(st.NATS.Connected))
	gauge(g.jetStreamUp, boolValue(st.JetStream.OK))
	fresh := !st.JetStream.AsOf.IsZero() && st.Time.Sub(st.JetStream.AsOf) <= maxJetStreamAge
	if fresh {
		gauge(g.consumers, float64(st.JetStream.Consumers))
		for _, t := range st.Topics {
			gauge(g.topicMessages, float64(t.Messages), t.Name)
			gauge(g.topicBytes, float64(t.Bytes), t.Name)
		}
	}
	attached := 0
	for _, s := range st.Subscriptions {
		if fresh && s.JetStreamRead {
			gauge(g.backlog, float64(s.Backlog), s.Name)
			gauge(g.oldest, s.OldestUnackedAgeSeconds, s.Name)
			if s.Delivery == "partitioned" {
				gauge(g.unowned, float64(s.UnownedPartitions()), s.Name)
			}
		}
		gauge(g.keys, float64(s.KeysInFlight), s.Name)
		gauge(g.paused, float64(s.PausedKeys), s.Name)
		gauge(g.maxAttempt, float64(s.MaxDeliveryAttempt), s.Name)
		gauge(g.outstanding, float64(s.Outstanding), s.Name)
		gauge(g.streams, float64(s.Streams), s.Name)
		attached += s.Streams
		if s.Delivery == "partitioned" {
			gauge(g.owned, float64(s.PartitionsOwned), s.Name)
			gauge(g.buffered, float64(s.PartitionBuffered), s.Name)
			gauge(g.full, float64(s.PartitionsFull), s.Name)
		}
		if s.DIDCommOpenGaps != nil {
			gauge(g.openGaps, float64(*s.DIDCommOpenGaps), s.Name)
		}
	}
	gauge(g.streams, float64(max(st.Streams-attached, 0)), "")
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
