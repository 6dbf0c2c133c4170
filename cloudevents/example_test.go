package cloudevents_test

import (
	"context"
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/jetorder/jetorder/adapter"
	ce "github.com/jetorder/jetorder/cloudevents"
)

// The example of docs/LIBRARY.md, "CloudEvents"; it compiles with the
// package but needs a server to run (integration/cloudevents_test.go runs
// the same calls).
func Example() {
	var (
		ctx   = context.Background()
		topic *adapter.Topic        // client.Topic("orders")
		sub   *adapter.Subscription // client.Subscription("shipping")
	)
	if topic == nil || sub == nil {
		return
	}
	e := ce.NewEvent() // stamps recordedtime: when the producer created it
	e.SetID("order-42-shipped")
	e.SetSource("/orders")
	e.SetType("com.example.order.shipped")
	e.SetExtension("partitionkey", "order-42") // the ordering key
	_ = e.SetData("application/json", map[string]any{"carrier": "ups"})
	if _, err := ce.Publish(ctx, topic, e).Get(ctx); err != nil {
		return
	}
	_ = ce.Receive(ctx, sub, func(ctx context.Context, e *event.Event, m *adapter.Message, err error) {
		if err != nil { // not a CloudEvent: acked after this returns, never redelivered
			return
		}
		seq, _ := ce.Sequence(*e)            // the producer's, or the topic position (20 digits)
		_, text, _, _ := ce.RecordedTime(*e) // exactly as the producer wrote it
		fmt.Println(seq, text)
		m.Ack()
	})
}
