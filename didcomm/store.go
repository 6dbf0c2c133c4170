package didcomm

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/keyrouter"
)

// Store keeps a tracker's state per thread, so that it survives restarts
// and is shared by every tracker using the same store. Implementations
// must be safe for concurrent use.
type Store interface {
	// Load returns the thread's saved state and its revision, or nil and 0
	// when nothing is saved.
	Load(ctx context.Context, thread string) (state []byte, rev uint64, err error)
	// Save saves the thread's state if its saved revision is still rev (0:
	// nothing saved), and returns the new revision. It returns
	// ErrStateConflict when another save came first.
	Save(ctx context.Context, thread string, state []byte, rev uint64) (uint64, error)
	// Delete removes the thread's state.
	Delete(ctx context.Context, thread string) error
}

// KVStore is a Store in a JetStream key-value bucket: one key per thread,
// saved with compare-and-set on the key's revision.
type KVStore struct {
	kv     jetstream.KeyValue
	prefix string
}

var _ Store = (*KVStore)(nil)

// NewKVStore keeps state in kv under keys prefix.<thread token>. prefix
// must be a valid KV key.
func NewKVStore(kv jetstream.KeyValue, prefix string) *KVStore {
	return &KVStore{kv: kv, prefix: prefix}
}

// SubscriptionStore is the store of a subscription's tracker: in the
// adapter's per-subscription state bucket, removed with the subscription.
// Every tracker opened on the same subscription shares it.
func SubscriptionStore(ctx context.Context, sub *adapter.Subscription) (*KVStore, error) {
	kv, prefix, err := sub.LayerState(ctx)
	if err != nil {
		return nil, err
	}
	return NewKVStore(kv, prefix+".didcomm"), nil
}

func (s *KVStore) key(thread string) string { return s.prefix + "." + keyrouter.KVToken(thread) }

// Load implements Store.
func (s *KVStore) Load(ctx context.Context, thread string) ([]byte, uint64, error) {
	e, err := s.kv.Get(ctx, s.key(thread))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

// Save implements Store.
func (s *KVStore) Save(ctx context.Context, thread string, state []byte, rev uint64) (uint64, error) {
	var (
		n   uint64
		err error
	)
	if rev == 0 {
		n, err = s.kv.Create(ctx, s.key(thread), state)
	} else {
		n, err = s.kv.Update(ctx, s.key(thread), state, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("%w: %v", ErrStateConflict, err)
	}
	return n, err
}

// Delete implements Store.
func (s *KVStore) Delete(ctx context.Context, thread string) error {
	err := s.kv.Purge(ctx, s.key(thread))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}
