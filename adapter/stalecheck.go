//go:build !jetorder_nostalecheck

package adapter

// staleCheck turns on the per-key receiver's check of key consumer
// deliveries that may be stale (receiver.onMsg, keyDeliveryDue). A build
// with the tag jetorder_nostalecheck turns it off: the cluster chaos
// test's negative control builds the sidecar so, to show that the test
// catches what the check prevents.
const staleCheck = true
