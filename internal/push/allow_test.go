package push

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseAllowList(t *testing.T) {
	good := []string{
		"", "loopback", "loopback:8080", "app.internal", "App.Internal.", "*.example.com", "*.example.com:443",
		"10.1.2.3", "10.1.2.3:80", "::1", "[::1]:8080", "10.0.0.0/8", "10.0.0.0/8:8080", "fd00::/8",
		"[fd00::/8]:9000", "loopback, app.internal ,10.0.0.0/8",
	}
	for _, s := range good {
		if _, err := ParseAllowList(s); err != nil {
			t.Errorf("ParseAllowList(%q): %v", s, err)
		}
	}
	bad := map[string]string{
		"a,,b":          "empty entry",
		"loopback,":     "empty entry",
		"10.0.0.1/8":    "host bits",
		"10.0.0.0/33":   "CIDR",
		"*.com":         "top-level",
		"a.*.com":       "wildcard",
		"*":             "wildcard",
		"host:0":        "port",
		"host:70000":    "port",
		"host:http":     "port",
		"[::1":          "missing ]",
		"[::1]x":        "after ]",
		"bad_host!":     "character",
		"-x.com":        "starting or ending",
		"fe80::1%eth0":  "zones",
		"exämple.com":   "xn--",
		"http://a.com/": "port",
	}
	for s, want := range bad {
		_, err := ParseAllowList(s)
		if !errors.Is(err, ErrInvalidAllowList) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAllowList(%q) = %v, want ErrInvalidAllowList mentioning %q", s, err, want)
		}
	}
}

func TestAllowListCheck(t *testing.T) {
	a, err := ParseAllowList("loopback,app.internal,*.example.com:443,10.0.0.0/8:8080,[fd00::/8]:9000,192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, endpoint string
		want           error
	}{
		{"localhost", "http://localhost:8080/push", nil},
		{"localhost trailing dot", "http://LOCALHOST.:8080/push", nil},
		{"127/8", "http://127.0.0.2/x", nil},
		{"ipv6 loopback", "http://[::1]:8080/x", nil},
		{"named host any port", "https://app.internal:1234/x", nil},
		{"wildcard default https port", "https://a.b.example.com/x", nil},
		{"wildcard explicit port", "https://a.example.com:443/x", nil},
		{"cidr with port", "http://10.9.8.7:8080/", nil},
		{"v6 cidr with port", "http://[fd00::5]:9000/", nil},
		{"single ip", "http://192.0.2.7/", nil},
		{"v4-mapped v6 loopback", "http://[::ffff:127.0.0.1]/", nil},

		{"other host", "http://evil.com/x", ErrNotAllowed},
		{"nip.io", "http://127.0.0.1.nip.io/x", ErrNotAllowed},
		{"wildcard apex", "https://example.com/x", ErrNotAllowed},
		{"wildcard wrong port", "http://a.example.com/x", ErrNotAllowed},
		{"suffix trick", "https://evilexample.com/x", ErrNotAllowed},
		{"cidr wrong port", "http://10.9.8.7/", ErrNotAllowed},
		{"outside cidr", "http://11.0.0.1:8080/", ErrNotAllowed},
		{"metadata", "http://169.254.169.254/", ErrNotAllowed},
		{"decimal ip", "http://2130706433/", ErrNotAllowed},
		{"unspecified", "http://0.0.0.0:8080/", ErrNotAllowed},

		{"userinfo", "http://user:pw@localhost/x", ErrInvalidEndpoint},
		{"userinfo allowed host trick", "http://localhost@evil.com/", ErrInvalidEndpoint},
		{"ftp", "ftp://localhost/x", ErrInvalidEndpoint},
		{"file", "file:///etc/passwd", ErrInvalidEndpoint},
		{"relative", "/push", ErrInvalidEndpoint},
		{"opaque", "http:localhost", ErrInvalidEndpoint},
		{"no host", "http:///x", ErrInvalidEndpoint},
		{"empty", "", ErrInvalidEndpoint},
		{"empty port", "http://localhost:/x", ErrInvalidEndpoint},
		{"port 0", "http://localhost:0/x", ErrInvalidEndpoint},
		{"zone", "http://[fe80::1%25eth0]/", ErrInvalidEndpoint},
		{"bad host chars", "http://loc$alhost/", ErrInvalidEndpoint},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := a.Check(c.endpoint)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Check(%q): %v", c.endpoint, err)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Check(%q) = %v, want %v", c.endpoint, err, c.want)
			}
		})
	}
	err = a.Check("http://evil.com:81/x")
	for _, want := range []string{"evil.com", FlagName} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestAllowListEmptyAllowsNothing(t *testing.T) {
	a, err := ParseAllowList("")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check("http://localhost/"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("Check = %v, want ErrNotAllowed", err)
	}
}

func TestDialAllows(t *testing.T) {
	a, err := ParseAllowList("loopback,app.internal,10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		host string
		ip   string
		want bool
	}{
		{"app.internal", "192.0.2.1", true},        // allowed by name: trusts its DNS
		{"app.internal", "10.1.1.1", true},         // and by prefix
		{"app.internal", "169.254.169.254", false}, // but never link-local (metadata)
		{"app.internal", "0.0.0.0", false},         // nor unspecified
		{"app.internal", "fe80::1", false},         // nor v6 link-local
		{"app.internal", "ff02::1", false},         // nor multicast
		{"localhost", "127.0.0.1", true},           // localhost is loopback only
		{"localhost", "192.0.2.1", false},          // (RFC 6761)
		{"other.name", "10.1.1.1", true},           // a prefix allows any name's address
		{"other.name", "192.0.2.1", false},         // name not allowed, address not allowed
		{"192.0.2.1", "192.0.2.1", false},          // an IP literal is not a name
		{"app.internal", "::ffff:10.0.0.1", true},  // mapped addresses are unmapped
		{"169.254.169.254", "169.254.169.254", false},
	}
	for _, c := range cases {
		if got := a.dialAllows(c.host, netip.MustParseAddr(c.ip), 80); got != c.want {
			t.Errorf("dialAllows(%s, %s) = %v, want %v", c.host, c.ip, got, c.want)
		}
	}
}

func TestDialContextRefusesRebinding(t *testing.T) {
	a, err := ParseAllowList("app.internal")
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
	}
	dial := a.dialContext(nil, lookup)
	_, err = dial(t.Context(), "tcp", "app.internal:80")
	if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Fatalf("dial = %v, want ErrNotAllowed naming the address", err)
	}
	_, err = dial(t.Context(), "tcp", "other.internal:80")
	if !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("dial other = %v, want ErrNotAllowed", err)
	}
}
