package grpcutil

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// LazyBucket is a KV bucket of the sidecar's own (JO_SCHEMAS, JO_SNAPSHOTS,
// JO_PUSH, ...), opened on first use and created with Config if it does
// not exist. Set Config before the first Open and leave it; the zero
// LazyBucket with a Config is ready for use. It is safe for concurrent use.
type LazyBucket struct {
	Config jetstream.KeyValueConfig

	mu sync.Mutex // held while opening
	kv jetstream.KeyValue
}

// Open returns the bucket, opening or creating it on the first call that
// succeeds; later calls return it at once. A call blocks while another
// opens the bucket, and up to ctx's deadline on the server. Errors are
// statuses (Status).
func (b *LazyBucket) Open(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := js.KeyValue(ctx, b.Config.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, b.Config)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, b.Config.Bucket) // another sidecar made it first
		}
	}
	if err != nil {
		return nil, Status(fmt.Errorf("open bucket %s: %w", b.Config.Bucket, err))
	}
	b.kv = kv
	return kv, nil
}
