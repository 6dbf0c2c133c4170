package adapter

import (
	"context"
	"fmt"
	"sync"
)

// flowController bounds the messages and bytes between Publish and their
// results. It is safe for concurrent use. acquire may block (with
// FlowControlBlock) until release makes room or its ctx ends; release never
// blocks. Every release wakes every blocked acquire, which then compete for
// the room: they are not served in the order they blocked.
//
// A limit below zero means none; newPublisher replaces a zero limit by the
// default before it builds the controller.
type flowController struct {
	cfg   FlowControlSettings
	mu    sync.Mutex
	cond  *sync.Cond
	msgs  int
	bytes int
}

func newFlowController(cfg FlowControlSettings) *flowController {
	f := &flowController{cfg: cfg}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// fits reports whether a message of size bytes may be taken now. Called
// with f.mu held.
func (f *flowController) fits(size int) bool {
	if f.msgs == 0 {
		return true // one message always goes, however large
	}
	return (f.cfg.MaxOutstandingMessages < 0 || f.msgs+1 <= f.cfg.MaxOutstandingMessages) &&
		(f.cfg.MaxOutstandingBytes < 0 || f.bytes+size <= f.cfg.MaxOutstandingBytes)
}

// acquire takes room for one message of size bytes. Before it blocks it
// calls onBlock, without holding f.mu, and calls the func that returns once
// it stops waiting.
//
// It returns ctx.Err() if ctx has ended on entry or ends while it waits,
// and an error wrapping ErrFlowControlLimit if the message does not fit and
// the behaviour is FlowControlSignalError. On an error it takes nothing.
func (f *flowController) acquire(ctx context.Context, size int, onBlock func() (done func())) error {
	f.mu.Lock()
	if err := ctx.Err(); err != nil {
		f.mu.Unlock()
		return err
	}
	if f.fits(size) {
		f.take(size)
		f.mu.Unlock()
		return nil
	}
	if f.cfg.LimitExceededBehavior == FlowControlSignalError {
		err := fmt.Errorf("%w: %d messages, %d bytes outstanding", ErrFlowControlLimit, f.msgs, f.bytes)
		f.mu.Unlock()
		return err
	}
	f.mu.Unlock()
	done := onBlock()
	defer done() // runs after f.mu.Unlock below: done takes the publisher's lock
	f.mu.Lock()
	defer f.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	for !f.fits(size) {
		if err := ctx.Err(); err != nil {
			return err
		}
		f.cond.Wait()
	}
	f.take(size)
	return nil
}

// take counts a message in. Called with f.mu held.
func (f *flowController) take(size int) {
	f.msgs++
	f.bytes += size
}

// release gives back the room of msgs messages of bytes bytes in all that
// acquire took, and wakes every blocked acquire. Giving back a batch's
// room at once wakes a blocked Publish once, not once per message.
func (f *flowController) release(msgs, bytes int) {
	f.mu.Lock()
	f.msgs -= msgs
	f.bytes -= bytes
	f.cond.Broadcast()
	f.mu.Unlock()
}
