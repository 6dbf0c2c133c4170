// Package faultproxy is a TCP proxy for tests that puts a misbehaving
// network between a NATS client and its server, or between two servers of
// a cluster (on a route): it can hold back the server's replies (as a
// congested or partitioned return path would) while the client's messages
// still reach the server, cut connections, and block the path (a network
// partition) until it is healed.
package faultproxy

import (
	"net"
	"strings"
	"sync"
)

// Proxy forwards every connection it accepts to one target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	held    bool
	waiting int // replies read and held back
	blocked bool
	conns   map[net.Conn]struct{}
	done    bool

	wg sync.WaitGroup
}

// Start listens on a random loopback port and forwards to target
// (host:port, or a nats:// URL).
func Start(target string) (*Proxy, error) {
	target = strings.TrimPrefix(target, "nats://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the nats:// URL clients connect to.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// HoldReplies stops forwarding bytes from the server to clients; they wait
// in the proxy (and the kernel's buffers) until ReleaseReplies.
func (p *Proxy) HoldReplies() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// HeldBack reports whether a reply from the server is being held back
// (HoldReplies): what the client sent reached the server, which answered.
func (p *Proxy) HeldBack() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held && p.waiting > 0
}

// ReleaseReplies forwards everything held, and later replies at once.
func (p *Proxy) ReleaseReplies() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every connection, dropping the replies held back, as a
// network that fails loses what it was carrying; new connections are
// accepted as before, and replies flow again.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Block cuts every connection and refuses new ones (they are accepted and
// closed at once) until Heal: the two sides are partitioned.
func (p *Proxy) Block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
	p.Cut()
}

// Heal ends a Block: new connections are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// Addr is the host:port the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines to end.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.done = true
	p.held = false
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.done {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(server, client, false)
		go p.forward(client, server, true)
	}
}

// forward copies from src to dst; a reply path waits while replies are
// held. Either side ending closes both.
func (p *Proxy) forward(dst, src net.Conn, replies bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if replies {
				p.mu.Lock()
				p.waiting++
				for p.held && !p.done {
					p.cond.Wait()
				}
				p.waiting--
				p.mu.Unlock()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
