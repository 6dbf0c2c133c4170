package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/status"
)

// The "status" run: what the sidecar's status page, /v1/status and
// /metrics cost with many keys in flight. A whole sidecar runs in this
// process on the bench's server; a client takes one message on each of
// -status-keys keys and holds them all unacked, so the sidecar holds every
// key at once; then each page is fetched over and over, one request at a
// time, and its latency reported.

var (
	statusKeys     = flag.Int("status-keys", 100_000, "keys in flight in the status run, one message each (times -scale)")
	statusRequests = flag.Int("status-requests", 200, "requests of each page in the status run")
	statusDelivery = flag.String("status-delivery", "partitioned", "delivery mode of the status run's subscription: partitioned or per-key (a consumer per key)")
)

func (b *bench) status() {
	keys := n(*statusKeys)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ready := make(chan sidecar.Listening, 1)
	done := make(chan error, 1)
	go func() {
		done <- sidecar.Run(ctx, sidecar.Config{
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", NATSURL: b.nc.ConnectedUrl(), Project: project,
			MaxOutstandingMessages: keys + 1000, ShutdownTimeout: 5 * time.Second,
		}, nil, func(l sidecar.Listening) { ready <- l })
	}()
	var at sidecar.Listening
	select {
	case at = <-ready:
	case err := <-done:
		check(err)
	}
	defer func() {
		stop()
		if err := <-done; err != nil {
			fmt.Println("status run: sidecar:", err)
		}
	}()
	conn, err := grpc.NewClient(at.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	check(err)
	defer conn.Close()
	pubc, subc := pb.NewPublisherClient(conn), pb.NewSubscriberClient(conn)

	topicID, subID := b.name("status"), b.name("status-sub")
	_, err = pubc.CreateTopic(ctx, &pb.Topic{Name: "projects/" + project + "/topics/" + topicID})
	check(err)
	subName := "projects/" + project + "/subscriptions/" + subID
	// Partitioned (the default): 8 partitions, each with room for its
	// share of the keys.
	labels := map[string]string{"jetorder-delivery": *statusDelivery}
	if *statusDelivery == "partitioned" {
		labels["jetorder-partition-buffer"] = strconv.Itoa(min(100_000, keys/4+1000))
	}
	_, err = subc.CreateSubscription(ctx, &pb.Subscription{Name: subName, Topic: "projects/" + project + "/topics/" + topicID,
		EnableMessageOrdering: true, AckDeadlineSeconds: 600, Labels: labels})
	check(err)
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, keys)

	// One stream takes every message and acks none.
	sctx, cancelStream := context.WithCancel(ctx)
	defer cancelStream()
	stream, err := subc.StreamingPull(sctx)
	check(err)
	check(stream.Send(&pb.StreamingPullRequest{Subscription: subName, StreamAckDeadlineSeconds: 600}))
	start := time.Now()
	for got := 0; got < keys; {
		resp, err := stream.Recv()
		check(err)
		got += len(resp.GetReceivedMessages())
	}
	fmt.Printf("status: %s subscription, %d keys in flight, one message each, held unacked by one StreamingPull stream (delivered in %v)\n",
		*statusDelivery, keys, time.Since(start).Round(time.Millisecond))

	base := "http://" + at.HTTP
	client := &http.Client{Timeout: 30 * time.Second}
	// Wait until the status shows every key, and the backlog read from
	// JetStream.
	for deadline := time.Now().Add(time.Minute); ; {
		st := fetchStatus(client, base)
		if st != nil && len(st.Subscriptions) > 0 {
			if s := st.Subscriptions[0]; s.KeysInFlight == keys && s.Backlog == uint64(keys) {
				fmt.Printf("status: the sidecar reads JetStream (topics, %d consumers) in %.1f ms, in the background, at most once a second\n",
					st.JetStream.Consumers, st.JetStream.ReadMillis)
				break
			}
		}
		if time.Now().After(deadline) {
			fmt.Println("status: the status never showed every key in flight; timing what it shows")
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, page := range []string{"/", "/v1/status", "/metrics"} {
		lat, size := timeGets(client, base+page, n(*statusRequests))
		fmt.Printf("status: GET %-10s %4d requests, %7d bytes: p50 %v p99 %v max %v\n", page, len(lat), size,
			pct(lat, 50), pct(lat, 99), slices.Max(lat))
	}
	fmt.Println()
}

func fetchStatus(client *http.Client, base string) *status.Status {
	resp, err := client.Get(base + "/v1/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st status.Status
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	return &st
}

// timeGets GETs url n times, one after another, and returns each time to
// the last byte of the body, and the body's size.
func timeGets(client *http.Client, url string, count int) ([]time.Duration, int) {
	lat := make([]time.Duration, 0, count)
	size := 0
	for range count {
		start := time.Now()
		resp, err := client.Get(url)
		check(err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		check(err)
		if resp.StatusCode != http.StatusOK {
			check(errors.New(url + ": " + resp.Status))
		}
		lat = append(lat, time.Since(start))
		size = len(body)
	}
	return lat, size
}

// pct is the p-th percentile of d (sorted in place).
func pct(d []time.Duration, p int) time.Duration {
	slices.Sort(d)
	i := min(len(d)-1, len(d)*p/100)
	return d[i].Round(10 * time.Microsecond)
}
