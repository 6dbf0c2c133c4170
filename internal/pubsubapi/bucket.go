package pubsubapi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// lazyBucket is a KV bucket of the sidecar's own (JO_SCHEMAS,
// JO_SNAPSHOTS), opened on first use and created if it does not exist.
type lazyBucket struct {
	cfg jetstream.KeyValueConfig

	mu sync.Mutex // held while opening
	kv jetstream.KeyValue
}

// open returns the bucket; errors are statuses.
func (b *lazyBucket) open(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := js.KeyValue(ctx, b.cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, b.cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, b.cfg.Bucket) // another sidecar made it first
		}
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("open bucket %s: %w", b.cfg.Bucket, err))
	}
	b.kv = kv
	return kv, nil
}
