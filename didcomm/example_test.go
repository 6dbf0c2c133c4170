package didcomm_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jetorder/jetorder/didcomm"
)

// The auctioneer of the specification sees bids 1 and 2 from Bob and bids
// 1 and 4 from Alice, and then a resend of Alice's 4.
func Example() {
	ctx := context.Background()
	bidders := didcomm.NewSequencer()
	tracker, _ := didcomm.NewTracker()

	var alice4 didcomm.Headers
	for _, from := range []string{"did:ex:bob", "did:ex:bob", "did:ex:alice", "did:ex:alice", "did:ex:alice", "did:ex:alice"} {
		h := didcomm.Headers{ID: fmt.Sprint(from, "-", bidders.Last("auction-1", from)+1), Thread: "auction-1", From: from}
		_ = bidders.Stamp(&h)
		if from == "did:ex:alice" && (h.SenderOrder == 2 || h.SenderOrder == 3) {
			continue // lost on the way
		}
		alice4 = h
		obs, _ := tracker.Observe(ctx, h, 0)
		for _, e := range obs.Events {
			fmt.Printf("%s %d: %s %d..%d\n", e.Sender, e.Order, e.Kind, e.Gap.First, e.Gap.Last)
		}
	}
	alice4.Resend()
	obs, _ := tracker.Observe(ctx, alice4, 0)
	fmt.Println("resend with sent_count", alice4.SentCount, "is a duplicate:", obs.Duplicate)

	ros, _ := tracker.ReceivedOrders(ctx, "auction-1")
	out, _ := json.Marshal(ros)
	fmt.Println(string(out))
	// Output:
	// did:ex:alice 4: gap opened 2..3
	// did:ex:alice 4: out of order 0..0
	// resend with sent_count 2 is a duplicate: true
	// [{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[2,3]}]
}
