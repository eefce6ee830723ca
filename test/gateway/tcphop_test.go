package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The HTTP hop taken apart (BenchmarkGatewayOverhead): the same JSON-RPC call on loopback with
// net/http on neither side (tcpClient against tcpFloor: the kernel, the two goroutine wake-ups
// and the client's encoding and decoding), with net/http's server alone (tcpClient against the
// floorServer), and with net/http on both sides (the raw-hop client). The differences are what
// net/http's server and net/http's client each add to a call.

// tcpClient sends HTTP/1.1 requests over one kept-alive TCP connection with no HTTP library: the
// request (rawRequest's body, the headers rawHTTP sends) in one write, the response's status
// line and headers read up to its Content-Length, the body decoded by rawEvent.
type tcpClient struct {
	conn net.Conn
	r    *bufio.Reader
	head string // request line and headers up to Content-Length's value
	seq  int64
	out  []byte
}

func newTCPClient(t testing.TB, endpoint, token string) *tcpClient {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &tcpClient{conn: conn, r: bufio.NewReaderSize(conn, 4<<10),
		head: fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: ", u.Path, u.Host, token)}
}

// send makes one SendMessage call.
func (c *tcpClient) send(_ context.Context, text string) (a2a.Event, error) {
	c.seq++
	body, err := rawRequest(c.seq, a2amqtt.MethodSendMessage, text)
	if err != nil {
		return nil, err
	}
	out := append(c.out[:0], c.head...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\n\r\n"...)
	c.out = append(out, body...)
	if _, err := c.conn.Write(c.out); err != nil {
		return nil, err
	}
	n, err := readHead(c.r, "HTTP/1.1 200 ")
	if err != nil {
		return nil, err
	}
	reply := make([]byte, n)
	if _, err := io.ReadFull(c.r, reply); err != nil {
		return nil, err
	}
	return rawEvent(reply)
}

// readHead reads a message's start line (which must begin with start) and headers, and returns
// its Content-Length.
func readHead(r *bufio.Reader, start string) (int, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if !bytes.HasPrefix(line, []byte(start)) {
		return 0, fmt.Errorf("start line %q", line)
	}
	length := -1
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if bytes.EqualFold(name, []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil {
				return 0, err
			}
		}
	}
	if length < 0 {
		return 0, errors.New("no Content-Length")
	}
	return length, nil
}

// tcpFloor is floorServer with no HTTP library: on each kept-alive connection it reads a
// request's head and body and answers with response, an HTTP/1.1 response whose body is the
// JSON-RPC response encoded beforehand. It returns the endpoint's URL.
func tcpFloor(t testing.TB, reply []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	response := fmt.Appendf(nil, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Mon, 07 Dec 2026 20:00:00 GMT\r\nContent-Length: %d\r\n\r\n%s", len(reply), reply)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReaderSize(conn, 4<<10)
				for {
					n, err := readHead(r, "POST ")
					if err != nil {
						return
					}
					if _, err := r.Discard(n); err != nil {
						return
					}
					if _, err := conn.Write(response); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}
