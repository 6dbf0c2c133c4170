package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// FlagName is the sidecar flag the allow-list comes from; errors name it
// so that an operator knows what to change.
const FlagName = "--push-allow"

// DefaultAllow is the flag's default: loopback addresses and localhost only.
const DefaultAllow = "loopback"

// AllowList says which push endpoints the sidecar may call. It is parsed
// once from the --push-allow flag and is read-only afterwards, so it is
// safe for concurrent use.
//
// Entries, comma-separated, each optionally followed by :port (an IPv6
// address or prefix with a port is written in brackets, [::1]:8080):
//
//   - loopback: 127.0.0.0/8, ::1 and localhost (the default);
//   - a host name, app.internal: that name exactly;
//   - *.example.com: any name below example.com (not example.com itself);
//   - an IP address, 10.1.2.3 or ::1;
//   - a CIDR prefix, 10.0.0.0/8 or fd00::/8.
//
// An entry without a port allows every port. The empty string allows
// nothing, which disables push subscriptions.
//
// The check happens twice. Check, when a subscription is created or
// updated, looks at the URL: its host must be an allowed name, or an IP
// literal inside an allowed address or prefix. The Client's dialer, at
// connect time, looks at the addresses the name resolved to, so that DNS
// cannot send an allowed name somewhere else (DNS rebinding): an address
// is dialed if an address or prefix entry allows it, or if the name was
// allowed by name and the address is not one that no name entry may reach
// (unspecified, link-local such as the 169.254.169.254 metadata service,
// multicast). localhost and *.localhost may only reach loopback addresses
// (RFC 6761). The dialer connects to the checked address itself, so there
// is no second lookup to race with.
type AllowList struct {
	src      string
	names    []nameRule
	prefixes []prefixRule
}

type nameRule struct {
	name   string // lower case, no trailing dot
	suffix bool   // *.name: strict subdomains only
	port   int    // 0: any
}

type prefixRule struct {
	prefix netip.Prefix
	port   int
}

// ParseAllowList reads the value of the --push-allow flag. Errors wrap
// ErrInvalidAllowList and name the bad entry.
func ParseAllowList(s string) (*AllowList, error) {
	a := &AllowList{src: s}
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	for _, raw := range strings.Split(s, ",") {
		entry := strings.TrimSpace(raw)
		if err := a.add(entry); err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrInvalidAllowList, entry, err)
		}
	}
	return a, nil
}

func (a *AllowList) add(entry string) error {
	if entry == "" {
		return errors.New("empty entry (two commas in a row, or a trailing comma)")
	}
	host, port, err := splitEntry(entry)
	if err != nil {
		return err
	}
	host = strings.ToLower(host)
	switch {
	case host == "loopback":
		a.prefixes = append(a.prefixes,
			prefixRule{netip.MustParsePrefix("127.0.0.0/8"), port},
			prefixRule{netip.MustParsePrefix("::1/128"), port})
		a.names = append(a.names, nameRule{name: "localhost", port: port})
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return fmt.Errorf("not a CIDR prefix: %v", err)
		}
		if p.Masked() != p {
			return fmt.Errorf("prefix has host bits set: did you mean %s?", p.Masked())
		}
		a.prefixes = append(a.prefixes, prefixRule{p, port})
	case strings.HasPrefix(host, "*."):
		name := strings.TrimSuffix(host[2:], ".")
		if err := checkHostName(name); err != nil {
			return err
		}
		if !strings.Contains(name, ".") {
			return fmt.Errorf("wildcard %q covers a whole top-level domain: name a domain below it", host)
		}
		a.names = append(a.names, nameRule{name: name, suffix: true, port: port})
	default:
		if ip, err := netip.ParseAddr(host); err == nil {
			if ip.Zone() != "" {
				return errors.New("IPv6 zones are not supported")
			}
			ip = ip.Unmap()
			a.prefixes = append(a.prefixes, prefixRule{netip.PrefixFrom(ip, ip.BitLen()), port})
			return nil
		}
		if strings.Contains(host, "*") {
			return errors.New("a wildcard must be the whole first label: *.example.com")
		}
		name := strings.TrimSuffix(host, ".")
		if err := checkHostName(name); err != nil {
			return err
		}
		a.names = append(a.names, nameRule{name: name, port: port})
	}
	return nil
}

// splitEntry splits "host[:port]", "[v6][:port]", a bare IPv6 address or
// prefix (more than one colon, no brackets: no port).
func splitEntry(entry string) (string, int, error) {
	if strings.HasPrefix(entry, "[") {
		end := strings.IndexByte(entry, ']')
		if end < 0 {
			return "", 0, errors.New("missing ]")
		}
		host, rest := entry[1:end], entry[end+1:]
		if rest == "" {
			return host, 0, nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", 0, fmt.Errorf("unexpected %q after ]", rest)
		}
		port, err := parsePort(rest[1:])
		return host, port, err
	}
	switch strings.Count(entry, ":") {
	case 0:
		return entry, 0, nil
	case 1:
		i := strings.IndexByte(entry, ':')
		port, err := parsePort(entry[i+1:])
		return entry[:i], port, err
	default:
		return entry, 0, nil // IPv6 without a port
	}
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || strings.HasPrefix(s, "+") {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	return p, nil
}

// checkHostName accepts DNS names of letters, digits, hyphens and
// underscores, in labels of 1 to 63 characters; internationalised names
// must be given in their xn-- form.
func checkHostName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a host name")
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("host name %q has an empty or over-long label", name)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host name %q has a label starting or ending with '-'", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host name %q has the character %q (internationalised names go in their xn-- form)", name, c)
			}
		}
	}
	return nil
}

// String returns the flag value the list was parsed from.
func (a *AllowList) String() string { return a.src }

// Check validates a push endpoint as a subscription's push_config names it
// and checks its host against the list. It returns nil, an error wrapping
// ErrInvalidEndpoint (not an absolute http or https URL with a host and no
// userinfo), or one wrapping ErrNotAllowed that names the host and the
// flag. The sidecar turns both into INVALID_ARGUMENT.
//
// Pub/Sub itself wants "a publicly accessible HTTPS address"; the sidecar
// pushes to applications beside it, so plain http is accepted too.
func (a *AllowList) Check(endpoint string) error {
	u, err := parseEndpoint(endpoint)
	if err != nil {
		return err
	}
	host, port := hostPort(u)
	if ip, err := netip.ParseAddr(host); err == nil {
		if a.allowsAddr(ip.Unmap(), port) {
			return nil
		}
	} else if a.allowsName(host, port) {
		return nil
	}
	return fmt.Errorf("%w: push endpoint %q: host %s (port %d) is not allowed by %s=%q; add it to %s to allow it",
		ErrNotAllowed, endpoint, host, port, FlagName, a.src, FlagName)
}

// parseEndpoint returns the URL if endpoint is an absolute http or https
// URL with a host, an optional valid port and no userinfo.
func parseEndpoint(endpoint string) (*url.URL, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidEndpoint, endpoint, why)
	}
	if endpoint == "" {
		return nil, bad("empty")
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, bad(err.Error())
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, bad("the scheme must be http or https")
	case u.Opaque != "":
		return nil, bad("not an absolute URL (write scheme://host/path)")
	case u.User != nil:
		return nil, bad("user information (user:password@) is not allowed in a push endpoint")
	case u.Host == "" || u.Hostname() == "":
		return nil, bad("no host")
	}
	if p := u.Port(); p != "" {
		if _, err := parsePort(p); err != nil {
			return nil, bad(err.Error())
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return nil, bad("empty port")
	}
	host := u.Hostname()
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return nil, bad("IPv6 zones are not allowed")
		}
		return u, nil
	}
	if strings.Contains(host, ":") || strings.Contains(host, "%") {
		return nil, bad("malformed host")
	}
	if err := checkHostName(strings.TrimSuffix(strings.ToLower(host), ".")); err != nil {
		return nil, bad(err.Error())
	}
	return u, nil
}

// hostPort returns the URL's host, lower case without a trailing dot, and
// its port, the scheme's default when none is written.
func hostPort(u *url.URL) (string, int) {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return host, n
	}
	if u.Scheme == "https" {
		return host, 443
	}
	return host, 80
}

func (a *AllowList) allowsAddr(ip netip.Addr, port int) bool {
	for _, r := range a.prefixes {
		if (r.port == 0 || r.port == port) && r.prefix.Contains(ip) {
			return true
		}
	}
	return false
}

func (a *AllowList) allowsName(host string, port int) bool {
	for _, r := range a.names {
		if r.port != 0 && r.port != port {
			continue
		}
		if r.suffix && strings.HasSuffix(host, "."+r.name) || !r.suffix && host == r.name {
			return true
		}
	}
	return false
}

// dialAllows is the connect-time rule (see AllowList): may a connection
// for host (as written in the URL) go to ip:port?
func (a *AllowList) dialAllows(host string, ip netip.Addr, port int) bool {
	ip = ip.Unmap()
	if a.allowsAddr(ip, port) {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil || !a.allowsName(host, port) {
		return false
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return ip.IsLoopback()
	}
	return !(ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast())
}

// LookupFunc resolves a host name to addresses; net.DefaultResolver's
// LookupNetIP("ip", host) is the default.
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// dialContext returns a DialContext for http.Transport that applies the
// connect-time rule: it resolves the name itself, keeps the allowed
// addresses and dials them in order, by address.
func (a *AllowList) dialContext(d *net.Dialer, lookup LookupFunc) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		host := strings.TrimSuffix(strings.ToLower(h), ".")
		port, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("push: bad port in %q", addr)
		}
		var addrs []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			addrs = []netip.Addr{ip}
		} else {
			if !a.allowsName(host, port) {
				return nil, fmt.Errorf("%w: host %s (port %d) is not allowed by %s=%q", ErrNotAllowed, host, port, FlagName, a.src)
			}
			if addrs, err = lookup(ctx, host); err != nil {
				return nil, err
			}
		}
		var refused []string
		var firstErr error
		for _, ip := range addrs {
			if !a.dialAllows(host, ip, port) {
				refused = append(refused, ip.String())
				continue
			}
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), p))
			if err == nil {
				return c, nil
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		if firstErr != nil {
			return nil, firstErr
		}
		if len(refused) == 0 {
			return nil, fmt.Errorf("push: host %s resolved to no address", host)
		}
		return nil, fmt.Errorf("%w: host %s resolved to %s, which %s=%q does not allow",
			ErrNotAllowed, host, strings.Join(refused, ", "), FlagName, a.src)
	}
}
