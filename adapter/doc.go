// Package adapter is jetorder's Go library: Google-Pub/Sub-style topics,
// subscriptions and ordering keys on NATS JetStream.
//
// A topic is a JetStream stream; a message's ordering key is a subject token
// after the key's slot, a hash of the key (see package keyrouter). Messages
// with the same ordering key reach each subscription in publish order: with
// message ordering enabled and StrictOrdering (the default), a message is
// never handed to a handler while an earlier message of its key is unacked,
// on any process receiving from the subscription; with PipelinedOrdering
// (partitioned delivery without exactly-once) a key's next message starts once the
// previous one's handler has returned, acked or not, up to
// ReceiveSettings.KeyWindow, and a nack brings the key back to the nacked
// message and on in order from there. Unkeyed messages, and every message
// of a subscription without ordering, go through one shared consumer and
// are never held back.
//
// # Vocabulary
//
// These words mean one thing each, here and in the sidecar:
//   - delivery mode: how an ordered subscription's keyed messages reach
//     receivers, DeliveryPartitioned or DeliveryPerKey, fixed at creation
//     (keyedDelivery runs it within one Receive call);
//   - ordering: when a key's next message may start, StrictOrdering or
//     PipelinedOrdering (the sidecar's label values "strict" and
//     "pipelined");
//   - receiver: one Receive call; its presence id answers on a subject
//     while it runs;
//   - owner, pin and term: the receiver a partition's messages go to, the
//     server's pin id it holds, and the span during which it holds one pin;
//   - terminate: the +TERM ack, sent only for a message moved to its
//     dead-letter topic;
//   - discovery lease: the key of the JO_LEASES bucket whose holder runs
//     per-key discovery, clean-up and take-over; a message's "lease" is
//     only the sidecar's word, for a message a client holds until its ack
//     deadline, as Pub/Sub says;
//   - floor: the stream sequence below which per-key discovery has seen
//     every message;
//   - take-over: a new owner (or the discovery lease's holder) having a
//     gone receiver's unacked messages redelivered at once.
//
// # Receiving
//
// One Receive call runs a receiver: a pool of handlers
// (ReceiveSettings.MaxOutstandingMessages), the messages it holds, whose ack
// deadlines it extends until they are settled, and one shutdown protocol.
// An ordered subscription's keyed messages reach it through its delivery
// mode, chosen when the subscription is created (SubscriptionConfig.Delivery).
//
// # Partitioned delivery (the default)
//
// The topic's keyed subjects carry the key's slot, 0..63; a partitioned
// subscription has one pull consumer per partition, whose one filter is a
// prefix of those slots, with the pinned-client priority policy: the server
// delivers a partition's messages to one receiving process at a time, the
// partition's owner, and moves the pin to another when the owner sends no
// pull request for the consumer's PinnedTTL (WithFailoverTimeout).
//
// The consumer's MaxAckPending is the partition's buffer
// (SubscriptionConfig.PartitionBuffer): the owner holds every delivered
// message until it is settled, and its gate for each key lets one message
// of the key into a handler at a time, the one with the lowest stream
// sequence. A key whose message was nacked or handed back waits until that
// message is delivered again, so later messages of the key never overtake
// it. A key's next message starts only once the server has its
// predecessor's ack: acks are confirmed with a round trip (one for all the
// acks sent meanwhile), so an ack lost with the connection cannot let a
// later message overtake its redelivery. (In a cluster the round trip
// reaches the server the client is connected to; an ack lost between it
// and the consumer's leader, in a fail-over, is not covered.)
//
// Ownership terms and the take-over fence. Every delivered message carries
// the pin id of the term it was sent in. When an owner sees a new pin id,
// it has just (re)gained the partition, and the previous owner may still
// have messages in its handlers. Within a term, a gap in the consumer's
// delivery sequence means a delivery was lost on the way: a message unacked
// at the server that no gate holds. Either way the owner fences: it starts
// no handler until the consumer's count of unacked messages equals the
// number it holds itself, unacked, and the first unacked message (the first
// of the partition after the consumer's ack floor) is one of them, and the
// server still has its pin (looked at again once its owner record is
// written: fast take-over, takeover.go). Every message it holds and has not
// acked is unacked at the server, so from then on every unacked message of
// the partition is in its hands, and its gates see them all. An owner whose
// pull request is refused asks the server who is pinned; if another client
// is, it hands its waiting messages back at once and keeps extending those
// in handlers, so the new owner waits for them to be acked. A dead owner's
// messages do not wait for their deadline: its presence subject has no
// responders, and the new owner has them redelivered at once (fast
// take-over, takeover.go). (The count can be fooled by an owner that acks,
// late, a message its deadline let the server redeliver elsewhere; the
// first-message check catches that when the hidden message is the first
// unacked one. docs/RELIABILITY.md.)
//
// The gates and the fence are one state machine per partition (gates.go,
// unit-tested on its own); partitioned.go feeds it what the server sends
// and answers, under the partition's own lock.
//
// # Per-key delivery
//
// Each key with messages gets its own durable push consumer with
// MaxAckPending 1, so JetStream itself holds a key's next message until the
// previous one is acked, for every receiving process at once. One receiving
// process per subscription, the holder of the subscription's discovery
// lease (a key of the JO_LEASES bucket), discovers new keys and removes the
// consumers of keys idle for WithKeyConsumerIdleTimeout with nothing
// pending; discovery.go says why that race loses and duplicates nothing.
// Every receiving process takes the key consumers' messages on one queue
// subscription.
//
// Take-over. A key whose message was pushed to a receiver that died would
// wait for that message's ack deadline. Every receiver records itself as a
// member of the subscription and answers on its presence subject; when one
// is gone, the discovery lease's holder pauses the key consumers with a
// message unacked, asks the other members which of those they hold, and
// nacks the rest, so they are redelivered at once (takeover_perkey.go).
//
// Stale deliveries. On a cluster, a paused server or a cut-off receiver
// can leave a delivery in flight past its ack deadline while the consumer
// delivers the message again elsewhere, and a consumer leader deposed by a
// partition may send a copy it had queued when the partition heals. A
// receiver hands a redelivery (or a delivery of a message stored nearly an
// ack deadline ago, on a cluster 2.5 s ago) to a handler
// only if the key consumer still counts it as its latest, unacked, and,
// for a redelivery, once the other receivers say they do not hold the
// message; each of them then drops the earlier delivery should it come
// (receiver.keyDeliveryDue, perKeyMode.heldElsewhere). A deposed leader
// catching up may also send a twin of its successor's first delivery, so
// for a while after a key consumer's leader is elected (nats-server's
// advisory) its first deliveries are checked the same way
// (receiver.newLeaderLately).
//
// # Inspection
//
// An Inspector reads, for monitoring, what the account holds: its topics
// (Inspector.Topics) and per subscription the backlog, unacked messages,
// partitions and their owners, the discovery floor and the oldest unacked
// message (Inspector.Subscriptions), with a bounded number of lookups. Its
// readers need none of the storage layout (docs/WIRE.md): this package
// writes it, and inspect.go is where it is read back for them. The
// sidecar's status page and metrics read through it.
package adapter
