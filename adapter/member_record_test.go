package adapter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/internal/testutil"
)

// A per-key receiver whose member record another deleted (a discoverer
// that took it for gone) writes it again: the other receivers' hold
// checks ask only the members they see.
func TestPerKeyMemberRecordWrittenAgain(t *testing.T) {
	_, c, _, sub := perKeySubscription(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Receive(ctx, func(_ context.Context, m *Message) { m.Ack() }) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	kv, err := c.stateBucket(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	records := func() []string {
		lister, err := kv.ListKeysFiltered(context.Background(), sub.memberPrefix()+"*")
		if err != nil {
			return nil
		}
		var keys []string
		for k := range lister.Keys() {
			keys = append(keys, strings.TrimPrefix(k, sub.memberPrefix()))
		}
		return keys
	}
	var member []string
	testutil.Eventually(t, 10*time.Second, func() bool { member = records(); return len(member) == 1 }, "no member record: %v", records)
	if err := kv.Delete(context.Background(), sub.memberPrefix()+member[0]); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { r := records(); return len(r) == 1 && r[0] == member[0] }, "the member record was not written again: %v", records)
}
