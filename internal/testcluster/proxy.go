package testcluster

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxyBufSize is the chunk size the proxy forwards at a time. Latency is
// added per chunk.
const proxyBufSize = 32 << 10

// Proxy is a TCP proxy with fault injection, placed in front of a control
// plane. It works below TLS, so clients keep verifying the API server's
// certificate.
//
// Concurrency: Proxy starts one accept goroutine, and two copy goroutines
// per connection. The target and all fault state are guarded by mu; copy goroutines wait on
// cond while black-holed. Close stops the accept loop, closes every
// connection, wakes every waiter and waits for all goroutines to return.
type Proxy struct {
	ln net.Listener

	mu        sync.Mutex
	cond      *sync.Cond
	target    string // host:port new connections go to; "" refuses them
	blackhole bool
	latency   time.Duration
	closed    bool
	conns     map[net.Conn]struct{}

	accepted atomic.Int64 // connections accepted, for Accepted

	wg sync.WaitGroup
}

// NewProxy listens on a loopback port the kernel picks and forwards to
// target ("" for nowhere yet; see SetTarget).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's https URL.
func (p *Proxy) URL() string { return "https://" + p.Addr() }

// Accepted returns how many connections the proxy has accepted: a client
// that opened none sent the API server no request.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// SetTarget points new connections at target (host:port). With "" the
// proxy accepts and closes them, as a dead server would. Open connections
// keep their upstream. A cluster's proxies follow its API server this way
// when a restart moves it to a new port, so clients keep one address.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// BlackHole stops all forwarding, on open and new connections alike. New
// connections are accepted and then hang, and bytes already read are held,
// as during a network partition that TCP retransmission later heals.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	p.blackhole = true
	p.mu.Unlock()
}

// SetLatency delays every forwarded chunk, in both directions, by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Reset closes every open connection with a TCP reset. New connections are
// served normally.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // linger 0 makes Close send RST
		}
		_ = c.Close()
	}
}

// Restore ends a black hole and removes latency. Held bytes flow again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.blackhole = false
	p.latency = 0
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and closes all its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers a connection so that Reset and Close reach it. It
// returns false once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if _, ok := p.gate(); !ok {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	if target == "" {
		return // the client sees a closed connection, as with a dead server
	}
	upstream, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return // likewise
	}
	if !p.track(upstream) {
		_ = upstream.Close()
		return
	}
	defer p.untrack(upstream)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(upstream, client) }()
	go func() { defer wg.Done(); p.pipe(client, upstream) }()
	wg.Wait()
}

// pipe copies src to dst until either side fails, then closes both so the
// opposite pipe ends too.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, proxyBufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			latency, ok := p.gate()
			if !ok {
				return
			}
			if latency > 0 {
				time.Sleep(latency)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: either way this direction is done
		}
	}
}

// gate blocks while the proxy is black-holed. It returns the latency to
// apply, and false if the proxy closed meanwhile.
func (p *Proxy) gate() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.blackhole && !p.closed {
		p.cond.Wait()
	}
	return p.latency, !p.closed
}
