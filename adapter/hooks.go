package adapter

// Hooks hear what Receive does, for metrics and logs: the library counts
// nothing itself and imports no metrics package (the sidecar implements
// Hooks with Prometheus). Set them in ReceiveSettings.Hooks; one value may
// serve many Receive calls, and its methods tell them apart by
// subscription.
//
// Methods are called from Receive's goroutines, concurrently, often with
// locks held: they must be safe for concurrent use, return quickly and
// never call back into the Subscription. Embed NoHooks to implement only
// some of them, and to stay compatible as methods are added.
type Hooks interface {
	// DeadLettered is called after m, delivered too often, was moved to
	// the subscription's dead-letter topic and terminated here.
	DeadLettered(sub *Subscription, m *Message)
	// PartitionChanged is called when a partition of a partitioned
	// subscription changes what this process holds of it; c says by how
	// much, so sums of the changes over every call are gauges.
	PartitionChanged(sub *Subscription, c PartitionChange)
}

// PartitionChange is a change in one partition of a partitioned
// subscription, as this process sees it.
type PartitionChange struct {
	// Partition is the partition's index, 0 to the partition count less
	// one: the NN of its consumer's name (docs/WIRE.md).
	Partition int
	// Owned is +1 when this process became the partition's owner, -1 when
	// it lost or gave the partition up.
	Owned int
	// Buffered is the change in the messages held of the partition: in
	// handlers or waiting behind an earlier message of their key.
	Buffered int
	// Full is +1 when the partition's buffer became full (until one of its
	// messages is acked, JetStream delivers nothing more of it, for any
	// key), -1 when it no longer is.
	Full int
}

// NoHooks implements Hooks doing nothing.
type NoHooks struct{}

var _ Hooks = NoHooks{}

func (NoHooks) DeadLettered(*Subscription, *Message)            {}
func (NoHooks) PartitionChanged(*Subscription, PartitionChange) {}
