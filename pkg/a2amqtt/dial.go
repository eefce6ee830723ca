package a2amqtt

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
)

// paho reads every packet straight from the connection: one read for the packet type, one per
// byte of the remaining length, one for the body, so three to four system calls per packet
// received. On a plain TCP connection (the default; a TLS connection buffers records itself)
// ClientSetup dials with a read buffer in between: one system call then brings in whatever
// the broker has sent, often several packets (a PUBACK and a reply). Writes are untouched:
// bufferedTCPConn embeds *net.TCPConn, so paho's net.Buffers still go out in one writev.

// readBufferSize holds several typical A2A messages.
const readBufferSize = 16 << 10

// bufferedTCPConn is a TCP connection whose reads go through a buffer.
type bufferedTCPConn struct {
	*net.TCPConn
	r *bufio.Reader
}

func (c *bufferedTCPConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// bufferedDial returns autopaho's AttemptConnection for u when it is a plain TCP broker URL
// and no proxy is configured (autopaho's own dialer honours all_proxy); nil otherwise, leaving
// TLS and WebSocket connections to autopaho.
func bufferedDial(u *url.URL, timeout time.Duration) func(context.Context, autopaho.ClientConfig, *url.URL) (net.Conn, error) {
	switch strings.ToLower(u.Scheme) {
	case "mqtt", "tcp", "":
	default:
		return nil
	}
	if os.Getenv("all_proxy") != "" {
		return nil
	}
	return func(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
		// autopaho hands this hook its long-lived context; the dial is bounded like its own.
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			return nil, err
		}
		tcp, ok := c.(*net.TCPConn)
		if !ok {
			_ = c.Close()
			return nil, fmt.Errorf("dial %s: not a TCP connection (%T)", u.Host, c)
		}
		return &bufferedTCPConn{TCPConn: tcp, r: bufio.NewReaderSize(tcp, readBufferSize)}, nil
	}
}
