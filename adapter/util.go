package adapter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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

// directBatchMaxBytes bounds one batched direct get's answer; a longer
// range takes more requests.
const directBatchMaxBytes = 1 << 20

// streamSeqs returns the stream sequences of the messages on filter from
// from to upTo, at most limit of them, oldest first. It reads them with
// batched direct gets (nats-server 2.11 and later): one round trip for up
// to a MiB of messages, where a message get costs one per message. A
// replica still catching up may leave some out, so it serves where a
// message left out costs only time (the take-over fence waits for those);
// against a server without batched gets it asks the leader message by
// message.
func (c *Client) streamSeqs(ctx context.Context, stream, filter string, from, upTo uint64, limit int) ([]uint64, error) {
	filter = cmp.Or(filter, ">") // a consumer without a filter reads the whole stream
	var seqs []uint64
	for from <= upTo && len(seqs) < limit {
		got, last, err := c.directBatch(ctx, stream, filter, from, int(min(upTo-from+1, uint64(limit-len(seqs)))))
		if errors.Is(err, errNoBatchGet) {
			return c.leaderSeqs(ctx, stream, filter, from, upTo, limit-len(seqs), seqs)
		}
		if err != nil {
			return seqs, err
		}
		for _, s := range got {
			if s > upTo {
				return seqs, nil
			}
			seqs = append(seqs, s)
		}
		if len(got) == 0 || last < from {
			return seqs, nil
		}
		from = last + 1
	}
	return seqs, nil
}

// errNoBatchGet: the server answered a batched direct get as a single one.
var errNoBatchGet = errors.New("the server does not support batched direct gets")

// directBatch asks for up to batch messages on filter from seq from and
// returns their sequences and the last one sent (less than batch when the
// answer reached directBatchMaxBytes, none at the end of the stream).
func (c *Client) directBatch(ctx context.Context, stream, filter string, from uint64, batch int) ([]uint64, uint64, error) {
	body, err := json.Marshal(struct {
		Seq      uint64 `json:"seq"`
		NextFor  string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes"`
	}{from, filter, batch, directBatchMaxBytes})
	if err != nil {
		return nil, 0, err
	}
	inbox := nats.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, 0, err
	}
	var seqs []uint64
	var last uint64
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return seqs, last, err
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "204", "404": // the end of the batch; nothing (more) on filter
			return seqs, last, nil
		case "503":
			return seqs, last, fmt.Errorf("direct get on %s: %w", stream, nats.ErrNoResponders)
		default:
			return seqs, last, fmt.Errorf("direct get on %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
		if m.Header.Get("Nats-Num-Pending") == "" && len(seqs) == 0 {
			return nil, 0, errNoBatchGet // a single message: batch was ignored
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return seqs, last, fmt.Errorf("direct get on %s: bad %s header: %w", stream, jetstream.SequenceHeader, err)
		}
		seqs = append(seqs, seq)
		last = seq
	}
}

// leaderSeqs is streamSeqs by one leader message get per message,
// appended to seqs.
func (c *Client) leaderSeqs(ctx context.Context, stream, filter string, from, upTo uint64, limit int, seqs []uint64) ([]uint64, error) {
	for seq := from; seq <= upTo && limit > 0; limit-- {
		found, err := c.leaderMsgSeq(ctx, stream, msgGetRequest{Seq: seq, NextBySubj: filter})
		if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && found > upTo) {
			return seqs, nil
		}
		if err != nil {
			return seqs, err
		}
		seqs = append(seqs, found)
		seq = found + 1
	}
	return seqs, nil
}

// rareWarning logs one warning at most once per interval: an outage
// fails the same way for every message, and one line per message would
// bury the rest of the log. The warnings not logged are counted: the next
// line logged says how many there were, and flush logs the last of them
// with the count when the warnings' source ends.
type rareWarning struct {
	now func() time.Time // time.Now; tests set it

	mu       sync.Mutex
	last     time.Time // the last line logged
	skipped  int       // warnings not logged since
	lastArgs []any     // the last of those
	lastMsg  string
}

// rareWarningInterval is how often a rareWarning logs at most.
const rareWarningInterval = 10 * time.Second

func (w *rareWarning) warn(log *slog.Logger, msg string, args ...any) {
	now := time.Now
	if w.now != nil {
		now = w.now
	}
	t := now()
	w.mu.Lock()
	if !w.last.IsZero() && t.Sub(w.last) < rareWarningInterval {
		w.skipped++
		w.lastMsg, w.lastArgs = msg, args
		w.mu.Unlock()
		return
	}
	skipped := w.skipped
	w.last, w.skipped, w.lastArgs = t, 0, nil
	w.mu.Unlock()
	if skipped > 0 {
		args = append(args, "not_logged_since_last", skipped)
	}
	log.Warn(msg, args...)
}

// flush logs the last warning not logged, with the count of those not
// logged, if there were any since the last line.
func (w *rareWarning) flush(log *slog.Logger) {
	w.mu.Lock()
	skipped, msg, args := w.skipped, w.lastMsg, w.lastArgs
	w.skipped, w.lastArgs = 0, nil
	w.mu.Unlock()
	if skipped > 0 {
		log.Warn(msg, append(args, "not_logged_since_last", skipped)...)
	}
}
