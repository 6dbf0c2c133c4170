// Package didcomm implements DIDComm Advanced Sequencing over jetorder
// topics: sender_order and sent_count on the sending side; on the receiving
// side gap detection, duplicate suppression and out-of-order detection per
// thread and sender, and the received_orders header.
//
// The ordered stream keeps each ordering key in publish order. DIDComm
// sequencing answers another question: which messages of a thread's
// parties did this party not get, whatever keys, topics or restarts they
// went through.
//
// A Sequencer stamps outgoing messages from counters in memory; a
// KVSequencer from counters in JetStream KV, shared by every process
// stamping for a sender and kept across restarts. A Tracker observes
// incoming ones;
// Receive runs one over a subscription, with its state in JetStream KV
// (OpenSubscriptionTracker), so every receiver of the subscription shares
// one view. Headers travel as top-level members of a DIDComm plaintext
// message, or as Didcomm- NATS headers beside any other payload
// (docs/WIRE.md).
package didcomm
