package grpcutil

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"a status as it is", status.Error(codes.NotFound, "gone"), codes.NotFound},
		{"max payload", fmt.Errorf("publish: %w", nats.ErrMaxPayload), codes.InvalidArgument},
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"cancelled", context.Canceled, codes.Canceled},
		{"no responders", nats.ErrNoResponders, codes.Unavailable},
		{"disconnected", fmt.Errorf("x: %w", nats.ErrDisconnected), codes.Unavailable},
		{"no stream response", jetstream.ErrNoStreamResponse, codes.Unavailable},
		{"server error", &jetstream.APIError{Code: 503, Description: "unavailable"}, codes.Unavailable},
		{"client error", &jetstream.APIError{Code: 400, Description: "bad request"}, codes.Internal},
		{"anything else", errors.New("boom"), codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(Status(tc.err)); got != tc.want {
				t.Fatalf("Status(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestPage(t *testing.T) {
	items := []string{"a", "b", "c", "d"}
	id := func(s string) string { return s }
	for _, tc := range []struct {
		name      string
		size      int32
		token     string
		want      []string
		wantToken string
	}{
		{"everything", 0, "", items, ""},
		{"first page", 3, "", []string{"a", "b", "c"}, "c"},
		{"last page", 3, "c", []string{"d"}, ""},
		{"exact fit", 4, "", items, ""},
		{"token between names", 2, "bb", []string{"c", "d"}, ""},
		{"token past the end", 2, "z", []string{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := Page(items, id, tc.size, tc.token)
			if err != nil || !slices.Equal(got, tc.want) || next != tc.wantToken {
				t.Fatalf("Page(%d, %q) = %v, %q, %v; want %v, %q", tc.size, tc.token, got, next, err, tc.want, tc.wantToken)
			}
		})
	}
	if _, _, err := Page(items, id, -1, ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative size: %v", err)
	}
}

func TestParseProject(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		code           codes.Code
	}{
		{"valid", "projects/my-project", "my-project", codes.OK},
		{"no prefix", "my-project", "", codes.InvalidArgument},
		{"empty id", "projects/", "", codes.InvalidArgument},
		{"a topic", "projects/p/topics/t", "", codes.InvalidArgument},
		{"invalid id", "projects/" + string(make([]byte, 300)), "", codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProject(tc.in)
			if got != tc.want || status.Code(err) != tc.code {
				t.Fatalf("ParseProject(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.code)
			}
		})
	}
}
