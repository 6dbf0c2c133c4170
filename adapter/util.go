package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// forEachParallel runs f over items with at most n at a time and returns
// the errors joined. It stops starting new items once ctx ends.
func forEachParallel[T any](ctx context.Context, items []T, n int, f func(context.Context, T) error) error {
	sem := make(chan struct{}, n)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(ctx, it); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// msgGetRequest is a JetStream message get request: the message at seq, the
// first at or after seq on NextBySubj, or the last on LastBySubj.
type msgGetRequest struct {
	Seq        uint64 `json:"seq,omitempty"`
	NextBySubj string `json:"next_by_subj,omitempty"`
	LastBySubj string `json:"last_by_subj,omitempty"`
}

// leaderMsgSeq asks the stream's leader for the message req names and
// returns its stream sequence, or jetstream.ErrMsgNotFound.
//
// Topic streams allow direct gets, and nats.go's Stream.GetMsg prefers
// them, but any replica answers a direct get, including one that is still
// catching up after a restart: it says "not found" of a message it has not
// got yet, or gives an older last message. Decisions that a message is
// gone, or which message comes first, ask the leader.
func (c *Client) leaderMsgSeq(ctx context.Context, stream string, req msgGetRequest) (uint64, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	reply, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, fmt.Errorf("message get on %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return 0, resp.Error
	case resp.Message == nil:
		return 0, jetstream.ErrInvalidJetStreamResponse
	}
	return resp.Message.Seq, nil
}
