package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/keyrouter"
)

const (
	project = "soak"
	topicID = "soak"
	subID   = "soak-sub"
)

// result is a pending publish: adapter.PublishResult and Google's
// pubsub.PublishResult both have this Get.
type result interface {
	Get(ctx context.Context) (string, error)
}

// target is the system under soak: a topic and an ordered subscription,
// reached either through the sidecar or through the library, over an
// embedded nats-server that this process also reaches directly to count
// consumers.
type target struct {
	js      jetstream.JetStream
	publish func(key string, data []byte) result
	// receive calls handle for each delivery, then acks it, until ctx ends.
	receive func(ctx context.Context, handle func(key string, data []byte)) error
	close   func()
}

// consumers is the number of JetStream consumers in the account: the
// subscription's key consumers, its key discovery consumer and anything
// else left behind (what the sidecar's jetorder_live_consumers reports).
func (t *target) consumers(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := t.js.AccountInfo(ctx)
	if err != nil {
		return 0, err
	}
	return info.Consumers, nil
}

// keyConsumers counts the subscription's per-key consumers by name.
func (t *target) keyConsumers(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := t.js.Stream(ctx, keyrouter.StreamName(project, topicID))
	if err != nil {
		return 0, err
	}
	prefix := keyrouter.KeyConsumerPrefix(project, subID)
	names := s.ConsumerNames(ctx)
	count := 0
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) {
			count++
		}
	}
	return count, names.Err()
}

// startSidecar runs the sidecar in this process as cmd/sidecar does, with
// its own embedded nats-server storing in dir, and drives it with Google's
// Go client set up as PUBSUB_EMULATOR_HOST sets it up. The sidecar's key
// consumers are retired after the adapter's default idle timeout (5s).
func startSidecar(dir string, log *slog.Logger) (*target, error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan sidecar.Listening, 1)
	cfg := sidecar.Config{
		GRPCAddr:   "127.0.0.1:0",
		HTTPAddr:   "off",
		DataDir:    dir,
		NATSListen: "127.0.0.1:0", // for this process's own consumer count
		Project:    project,
	}
	go func() { done <- sidecar.Run(ctx, cfg, log, func(l sidecar.Listening) { ready <- l }) }()
	var at sidecar.Listening
	select {
	case at = <-ready:
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("sidecar ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("sidecar not ready within 30s")
	}
	stopSidecar := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, "soak: sidecar:", err)
			}
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "soak: sidecar did not stop within 30s")
		}
	}
	nc, err := nats.Connect(at.NATS)
	if err != nil {
		stopSidecar()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		stopSidecar()
		return nil, err
	}
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(at.GRPC), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	actx, cancelAdmin := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelAdmin()
	if err == nil {
		_, err = c.TopicAdminClient.CreateTopic(actx, &pb.Topic{Name: "projects/" + project + "/topics/" + topicID})
	}
	if err == nil {
		_, err = c.SubscriptionAdminClient.CreateSubscription(actx, &pb.Subscription{
			Name:                  "projects/" + project + "/subscriptions/" + subID,
			Topic:                 "projects/" + project + "/topics/" + topicID,
			EnableMessageOrdering: true,
			Labels:                map[string]string{"jetorder-delivery": *delivery},
		})
	}
	if err != nil {
		if c != nil {
			_ = c.Close()
		}
		nc.Close()
		stopSidecar()
		return nil, err
	}
	pub := c.Publisher(topicID)
	pub.EnableMessageOrdering = true
	return &target{
		js: js,
		publish: func(key string, data []byte) result {
			return pub.Publish(context.Background(), &pubsub.Message{Data: data, OrderingKey: key})
		},
		receive: func(ctx context.Context, handle func(string, []byte)) error {
			return c.Subscriber(subID).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				handle(m.OrderingKey, m.Data)
				m.Ack()
			})
		},
		close: func() {
			pub.Stop()
			_ = c.Close()
			nc.Close()
			stopSidecar()
		},
	}, nil
}

// startLibrary uses the library directly on an embedded nats-server
// storing in dir, with key consumers retired after idle.
func startLibrary(dir string, idle time.Duration, log *slog.Logger) (*target, error) {
	srv, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectBufSize(-1))
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	fail := func(err error) (*target, error) {
		nc.Close()
		srv.Shutdown()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	client, err := adapter.NewClient(nc, project, adapter.WithKeyConsumerIdleTimeout(idle), adapter.WithLogger(log))
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	topic, err := client.CreateTopic(ctx, topicID)
	if err != nil {
		return fail(err)
	}
	sub, err := client.CreateSubscription(ctx, subID, adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryMode(*delivery)})
	if err != nil {
		return fail(err)
	}
	return &target{
		js: js,
		publish: func(key string, data []byte) result {
			return topic.Publish(ctx, &adapter.Message{Data: data, OrderingKey: key})
		},
		receive: func(ctx context.Context, handle func(string, []byte)) error {
			return sub.Receive(ctx, func(_ context.Context, m *adapter.Message) {
				handle(m.OrderingKey, m.Data)
				m.Ack()
			})
		},
		close: func() {
			_ = client.Close()
			nc.Close()
			srv.Shutdown()
		},
	}, nil
}
