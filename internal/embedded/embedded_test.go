package embedded

import (
	"errors"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Configure's changes reach the server: here, it requires a password.
func TestConfigure(t *testing.T) {
	s, err := Start(Config{StoreDir: t.TempDir(), Configure: func(o *server.Options) {
		o.Username, o.Password = "app", "s3cret"
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("connect without a password: %v, want %v", err, nats.ErrAuthorization)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}
