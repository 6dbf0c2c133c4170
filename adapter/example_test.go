package adapter_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
)

// The library example of docs/LIBRARY.md, run against an embedded server.
func Example() {
	dir, _ := os.MkdirTemp("", "jetorder-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectBufSize(-1))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	ctx := context.Background()

	client, err := adapter.NewClient(nc, "my-project")
	if err != nil {
		panic(err)
	}
	topic, err := client.CreateTopic(ctx, "user-events")
	if err != nil {
		panic(err)
	}
	sub, err := client.CreateSubscription(ctx, "event-processor", adapter.SubscriptionConfig{
		Topic:                 topic,
		EnableMessageOrdering: true,
		AckDeadline:           10 * time.Second,
	})
	if err != nil {
		panic(err)
	}
	for _, event := range []string{"login", "page_view", "logout"} {
		res := topic.Publish(ctx, &adapter.Message{Data: []byte(event), OrderingKey: "user-123"})
		if _, err := res.Get(ctx); err != nil {
			panic(err)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := 0
	err = sub.Receive(rctx, func(_ context.Context, m *adapter.Message) {
		// One key: handlers run one at a time, so n needs no lock.
		fmt.Println(m.OrderingKey, string(m.Data))
		if n++; n == 3 {
			cancel()
		}
		m.Ack()
	})
	if err != nil {
		panic(err)
	}
	// Output:
	// user-123 login
	// user-123 page_view
	// user-123 logout
}
