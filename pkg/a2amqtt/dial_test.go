package a2amqtt

import (
	"context"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
)

// Plain TCP broker URLs get the buffered dial; TLS, WebSocket and proxied connections keep
// autopaho's own dialers. The buffered connection reads what the peer wrote, in order.
func TestBufferedDial(t *testing.T) {
	for _, raw := range []string{"mqtts://h:8883", "ssl://h:8883", "ws://h/mqtt", "wss://h/mqtt"} {
		u, _ := url.Parse(raw)
		if bufferedDial(u, time.Second) != nil {
			t.Errorf("%s: buffered dial used; want autopaho's dialer", raw)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		_, _ = c.Write([]byte("first packet|second packet"))
	}()
	u, _ := url.Parse("mqtt://" + ln.Addr().String())
	t.Setenv("all_proxy", "socks5://127.0.0.1:1")
	if bufferedDial(u, time.Second) != nil {
		t.Error("buffered dial used despite all_proxy; want autopaho's proxy-aware dialer")
	}
	t.Setenv("all_proxy", "")
	dial := bufferedDial(u, 5*time.Second)
	if dial == nil {
		t.Fatal("no buffered dial for a plain TCP URL")
	}
	c, err := dial(context.Background(), autopaho.ClientConfig{}, u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "first packet|second packet" {
		t.Fatalf("read %q, %v", got, err)
	}
}
