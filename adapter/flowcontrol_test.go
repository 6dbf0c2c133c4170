package adapter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// blockProbe is an onBlock for flowController.acquire that counts its
// calls and the calls of the done func it returns, and can run an action
// while acquire is about to block.
type blockProbe struct {
	blocks, dones atomic.Int32
	then          func()
}

func (p *blockProbe) onBlock() (done func()) {
	p.blocks.Add(1)
	if p.then != nil {
		p.then()
	}
	return func() { p.dones.Add(1) }
}

func (p *blockProbe) check(t *testing.T, blocks int32) {
	t.Helper()
	if got := p.blocks.Load(); got != blocks {
		t.Errorf("onBlock called %d times, want %d", got, blocks)
	}
	if got := p.dones.Load(); got != blocks {
		t.Errorf("done called %d times, want %d", got, blocks)
	}
}

// mustNotBlock is an onBlock for acquires that must find room.
func mustNotBlock(t *testing.T) func() func() {
	return func() func() {
		t.Fatal("acquire blocked where it must find room")
		return nil
	}
}

func checkOutstanding(t *testing.T, f *flowController, msgs, bytes int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.msgs != msgs || f.bytes != bytes {
		t.Errorf("outstanding: %d messages, %d bytes; want %d, %d", f.msgs, f.bytes, msgs, bytes)
	}
}

func totalSize(sizes []int) int {
	n := 0
	for _, s := range sizes {
		n += s
	}
	return n
}

// One acquire against what is outstanding, under each limit behaviour: a
// message that fits is taken at once; one that does not fails with
// ErrFlowControlLimit, or blocks (onBlock ends its ctx here, so the wait
// ends with the ctx's error), and either way takes nothing.
func TestFlowControllerAcquire(t *testing.T) {
	tests := []struct {
		name        string
		maxMsgs     int
		maxBytes    int
		outstanding []int // sizes acquired before
		size        int
		fits        bool
	}{
		{"under the message limit", 2, -1, []int{1}, 1, true},
		{"at the message limit", 2, -1, []int{1, 1}, 1, false},
		{"up to the byte limit", -1, 10, []int{6}, 4, true},
		{"over the byte limit", -1, 10, []int{6}, 5, false},
		{"messages bind before bytes", 2, 100, []int{1, 1}, 1, false},
		{"bytes bind before messages", 100, 10, []int{9}, 2, false},
		{"bigger than the byte limit with nothing outstanding", 10, 10, nil, 11, true},
		{"bigger than the byte limit behind another message", 10, 10, []int{1}, 11, false},
		{"message limit one with nothing outstanding", 1, 10, nil, 5, true},
		{"no limits", -1, -1, []int{1 << 30, 1 << 30, 1 << 30}, 1 << 30, true},
	}
	behaviours := []struct {
		name string
		b    LimitExceededBehavior
	}{{"block", FlowControlBlock}, {"signal error", FlowControlSignalError}}
	for _, tt := range tests {
		for _, bh := range behaviours {
			t.Run(tt.name+"/"+bh.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					f := newFlowController(FlowControlSettings{MaxOutstandingMessages: tt.maxMsgs, MaxOutstandingBytes: tt.maxBytes, LimitExceededBehavior: bh.b})
					for _, s := range tt.outstanding {
						if err := f.acquire(context.Background(), s, mustNotBlock(t)); err != nil {
							t.Fatalf("setting up: %v", err)
						}
					}
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					probe := &blockProbe{then: cancel}
					err := f.acquire(ctx, tt.size, probe.onBlock)
					switch {
					case tt.fits:
						if err != nil {
							t.Fatalf("acquire: %v, want room", err)
						}
						probe.check(t, 0)
						checkOutstanding(t, f, len(tt.outstanding)+1, totalSize(tt.outstanding)+tt.size)
						return
					case bh.b == FlowControlSignalError:
						if !errors.Is(err, ErrFlowControlLimit) {
							t.Fatalf("acquire: %v, want ErrFlowControlLimit", err)
						}
						probe.check(t, 0)
					default:
						if !errors.Is(err, context.Canceled) {
							t.Fatalf("acquire: %v, want the ctx's error after blocking", err)
						}
						probe.check(t, 1)
					}
					checkOutstanding(t, f, len(tt.outstanding), totalSize(tt.outstanding))
				})
			})
		}
	}
}

// acquireAsync runs acquire on its own goroutine; its error arrives on the
// returned channel.
func acquireAsync(ctx context.Context, f *flowController, size int, probe *blockProbe) <-chan error {
	res := make(chan error, 1)
	go func() { res <- f.acquire(ctx, size, probe.onBlock) }()
	return res
}

// acquireReturned reports whether an acquireAsync has returned, once every
// goroutine of the bubble is blocked or done.
func acquireReturned(t *testing.T, res <-chan error) (error, bool) {
	t.Helper()
	synctest.Wait()
	select {
	case err := <-res:
		return err, true
	default:
		return nil, false
	}
}

// Blocked acquires, with FlowControlBlock: what wakes them, what they take.
func TestFlowControllerBlocked(t *testing.T) {
	block := func(t *testing.T, maxMsgs, maxBytes int, outstanding ...int) *flowController {
		f := newFlowController(FlowControlSettings{MaxOutstandingMessages: maxMsgs, MaxOutstandingBytes: maxBytes})
		for _, s := range outstanding {
			if err := f.acquire(context.Background(), s, mustNotBlock(t)); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"an ended ctx is refused even with room", func(t *testing.T) {
			f := block(t, 10, 10)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			probe := &blockProbe{}
			if err := f.acquire(ctx, 1, probe.onBlock); !errors.Is(err, context.Canceled) {
				t.Fatalf("acquire: %v, want context.Canceled", err)
			}
			probe.check(t, 0)
			checkOutstanding(t, f, 0, 0)
		}},
		{"release makes room", func(t *testing.T) {
			f := block(t, 1, -1, 3)
			probe := &blockProbe{}
			res := acquireAsync(context.Background(), f, 2, probe)
			if _, ok := acquireReturned(t, res); ok {
				t.Fatal("acquire did not wait for room")
			}
			if probe.blocks.Load() != 1 || probe.dones.Load() != 0 {
				t.Fatalf("while blocked: onBlock %d, done %d calls; want 1, 0", probe.blocks.Load(), probe.dones.Load())
			}
			f.release(1, 3)
			if err, ok := acquireReturned(t, res); !ok || err != nil {
				t.Fatalf("after release: returned %v, err %v", ok, err)
			}
			probe.check(t, 1)
			checkOutstanding(t, f, 1, 2)
		}},
		{"ctx ends while blocked", func(t *testing.T) {
			f := block(t, 1, -1, 3)
			ctx, cancel := context.WithCancel(context.Background())
			probe := &blockProbe{}
			res := acquireAsync(ctx, f, 2, probe)
			if _, ok := acquireReturned(t, res); ok {
				t.Fatal("acquire did not wait for room")
			}
			cancel()
			if err, ok := acquireReturned(t, res); !ok || !errors.Is(err, context.Canceled) {
				t.Fatalf("after cancel: returned %v, err %v; want context.Canceled", ok, err)
			}
			probe.check(t, 1)
			checkOutstanding(t, f, 1, 3)
		}},
		{"deadline passes while blocked", func(t *testing.T) {
			f := block(t, 1, -1, 3)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			probe := &blockProbe{}
			// synctest's clock moves once everything waits.
			if err := <-acquireAsync(ctx, f, 2, probe); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("acquire: %v, want DeadlineExceeded", err)
			}
			probe.check(t, 1)
			checkOutstanding(t, f, 1, 3)
		}},
		{"release wakes every waiter that then fits", func(t *testing.T) {
			f := block(t, -1, 10, 10)
			a, b := &blockProbe{}, &blockProbe{}
			resA := acquireAsync(context.Background(), f, 5, a)
			resB := acquireAsync(context.Background(), f, 5, b)
			synctest.Wait()
			f.release(1, 10)
			for _, res := range []<-chan error{resA, resB} {
				if err, ok := acquireReturned(t, res); !ok || err != nil {
					t.Fatalf("after release: returned %v, err %v", ok, err)
				}
			}
			a.check(t, 1)
			b.check(t, 1)
			checkOutstanding(t, f, 2, 10)
		}},
		{"a later message that fits passes an earlier one that does not", func(t *testing.T) {
			// Waiters are not served in the order they blocked: room goes
			// to whoever fits when it is released.
			f := block(t, -1, 10, 5, 5)
			large, small := &blockProbe{}, &blockProbe{}
			resLarge := acquireAsync(context.Background(), f, 8, large)
			synctest.Wait()
			resSmall := acquireAsync(context.Background(), f, 2, small)
			synctest.Wait()
			f.release(1, 5)
			if err, ok := acquireReturned(t, resSmall); !ok || err != nil {
				t.Fatalf("small message after release: returned %v, err %v", ok, err)
			}
			if _, ok := acquireReturned(t, resLarge); ok {
				t.Fatal("large message taken without room")
			}
			f.release(1, 5)
			if err, ok := acquireReturned(t, resLarge); !ok || err != nil {
				t.Fatalf("large message after the second release: returned %v, err %v", ok, err)
			}
			checkOutstanding(t, f, 2, 10)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { synctest.Test(t, tt.run) })
	}
}
