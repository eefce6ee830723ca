// Package brokers is the one place that turns a broker choice into an acl.Backend: the factory
// cmd/manager, cmd/devstack and test/testenv use. A backend is one package implementing
// acl.Backend (internal/mqtt/dynsec for Mosquitto's dynamic-security plugin, internal/mqtt/embedded
// for the broker the operator runs itself) plus one entry of Kinds here; docs/broker.md
// ("Adding a backend") says what else it must pass.
package brokers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sort"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
)

// The kinds of broker the operator can administer.
const (
	// Dynsec is a Mosquitto 2.x with its dynamic-security plugin, administered over MQTT as an
	// admin user (Config.URL, Username, Password, TLS).
	Dynsec = "dynsec"
	// Embedded is the operator's own broker (mochi-mqtt) in its process, listening on
	// Config.URL's host and port (port 0: a free one).
	Embedded = "embedded"
	// Table is a Mosquitto 2.x with the a2a-fleet decision-table plugin (internal/mqtt/mosqtable):
	// the operator's acl.Policy decides inside the broker, a change costs the same at any fleet
	// size. Administered over MQTT as the plugin's admin (Config.URL, Username, Password, TLS).
	Table = "table"
)

// Config says which broker the operator administers and how.
type Config struct {
	// Kind is one of Kinds (default Dynsec).
	Kind string
	// URL is the broker's MQTT URL (mqtt://, mqtts://, tls://): where the operator connects, or,
	// for Embedded, where the broker listens.
	URL string
	// Username and Password of the broker's admin (Dynsec, Table).
	Username, Password string
	// TLS of the admin connection (Dynsec; a2amqtt.BrokerTLS builds it) or of the listener
	// (Embedded: a server configuration).
	TLS *tls.Config
	// SnapshotPath keeps the embedded broker's identities across restarts (Embedded; empty: in
	// memory only).
	SnapshotPath string
	// MaxPacketSize is the largest MQTT packet the embedded broker accepts (0: no limit).
	MaxPacketSize uint32
	// Logger of the backend's own connections (Dynsec; the embedded broker's own logs stay off).
	Logger *slog.Logger
}

// Broker is a backend ready for the operator's broker runtime (registration.BrokerConfig).
type Broker struct {
	Backend acl.Backend
	// URL is where clients reach the broker (for Embedded, the address it listens on).
	URL string
	// Open starts the backend's connection when the runtime starts (nil: ready already).
	Open func(context.Context) error
	// Close stops what New started.
	Close func() error
}

// Factory builds a Broker from a Config of its kind.
type Factory func(Config) (Broker, error)

// factories are the kinds: a new backend is one line here.
var factories = map[string]Factory{
	Dynsec:   newDynsec,
	Embedded: newEmbedded,
	Table:    newTable,
}

// Kinds lists the kinds New knows, sorted.
func Kinds() []string {
	out := make([]string, 0, len(factories))
	for k := range factories {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// New builds the broker of cfg.Kind.
func New(cfg Config) (Broker, error) {
	if cfg.Kind == "" {
		cfg.Kind = Dynsec
	}
	f, ok := factories[cfg.Kind]
	if !ok {
		return Broker{}, fmt.Errorf("brokers: unknown broker kind %q (known: %v)", cfg.Kind, Kinds())
	}
	if cfg.URL == "" {
		return Broker{}, errors.New("brokers: the broker URL is required")
	}
	return f(cfg)
}

// Connect is New plus Open, for tools and tests: the backend is usable when it returns.
func Connect(ctx context.Context, cfg Config) (Broker, error) {
	b, err := New(cfg)
	if err != nil {
		return Broker{}, err
	}
	if b.Open != nil {
		if err := b.Open(ctx); err != nil {
			_ = b.Close()
			return Broker{}, err
		}
		b.Open = nil
	}
	return b, nil
}

func newDynsec(cfg Config) (Broker, error) {
	ds, err := dynsec.New(dynsec.Config{URL: cfg.URL, Username: cfg.Username, Password: cfg.Password, TLS: cfg.TLS, Logger: cfg.Logger})
	if err != nil {
		return Broker{}, err
	}
	closeConn := func() error {
		// Bounded: a broker that is gone must not hold up a shutdown.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return ds.Close(ctx)
	}
	return Broker{Backend: ds, URL: cfg.URL, Open: ds.Open, Close: closeConn}, nil
}

func newTable(cfg Config) (Broker, error) {
	tb, err := mosqtable.New(mosqtable.Config{URL: cfg.URL, Username: cfg.Username, Password: cfg.Password, TLS: cfg.TLS, Logger: cfg.Logger})
	if err != nil {
		return Broker{}, err
	}
	closeConn := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return tb.Close(ctx)
	}
	return Broker{Backend: tb, URL: cfg.URL, Open: tb.Open, Close: closeConn}, nil
}

func newEmbedded(cfg Config) (Broker, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return Broker{}, fmt.Errorf("brokers: embedded broker URL: %w", err)
	}
	if !slices.Contains([]string{"mqtt", "tcp", "mqtts", "tls", "ssl"}, u.Scheme) || u.Port() == "" {
		return Broker{}, fmt.Errorf("brokers: embedded broker URL %s: want mqtt://host:port (or mqtts:// with TLS)", cfg.URL)
	}
	srv, err := embedded.Start(embedded.Config{Addr: u.Host, TLS: cfg.TLS, MaxPacketSize: cfg.MaxPacketSize,
		Store: embedded.StoreConfig{Prefix: acl.DefaultPrefix, SnapshotPath: cfg.SnapshotPath}})
	if err != nil {
		return Broker{}, fmt.Errorf("start embedded broker: %w", err)
	}
	return Broker{Backend: srv.Backend(), URL: srv.URL(), Close: srv.Close}, nil
}
