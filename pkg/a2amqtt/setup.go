package a2amqtt

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// ClientSetup is the one autopaho setup of a2a-fleet's MQTT v5 clients. The SDK's Conn and the
// operator's own broker connections (internal/mqtt/session: the dynsec admin connection, the
// card publisher) build their autopaho.ClientConfig here, so they connect, reconnect and log
// alike:
//
//   - a clean session on every connect, not only the first (autopaho's default), unless
//     SessionExpiry asks for a persistent one (Clean Start 0 from the first CONNECT on);
//   - Request Problem Information asked for whenever a CONNECT property is set;
//   - the password asked for at every attempt (a rotated one is used from the next reconnect);
//   - ReconnectBackoff (immediate, then 250 ms doubling up to 5 s), and the same growing delay
//     before reconnecting after connections that keep being lost right after they came up
//     (takeoverBackoff: two clients with one client ID);
//   - quiet logs: a lost connection and its restoration are INFO, a dial error stays DEBUG until
//     the broker has been unreachable for 30 s (then one WARN per distinct cause), a refused
//     CONNECT is one WARN per distinct cause, a broker's DISCONNECT is INFO when expected
//     (shutdown, administrative kick) and WARN otherwise;
//   - a ConnState that health checks read.
type ClientSetup struct {
	// URL is the broker, as ParseBrokerURL returns it.
	URL *url.URL
	// TLS is used with TLS URLs (mqtts://, tls://, ssl://, wss://).
	TLS      *tls.Config
	ClientID string
	Username string
	// Password is asked for at every connection attempt (nil or empty: none).
	Password func() []byte
	// Credentials, when set, replaces Username and Password: it is asked for both at every
	// connection attempt (a credentials folder that a rotation rewrites, CredentialsDir).
	Credentials CredentialSource
	// RefusedRetry, when > 0, caps the reconnect delay after the broker refused a CONNECT (bad or
	// rotated credentials), so credentials that change are tried again within it rather than
	// after ReconnectBackoff's 5 s.
	RefusedRetry time.Duration
	// KeepAlive (default DefaultKeepAlive) and ConnectTimeout (default DefaultConnectTimeout).
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	// PacketTimeout bounds paho's wait for an acknowledgement (paho's default, 10 s, when 0).
	PacketTimeout time.Duration
	// SessionExpiry > 0 keeps a persistent session (Clean Start 0 and this Session Expiry
	// Interval on every CONNECT, the first one included); 0 is a clean session on every connect.
	SessionExpiry time.Duration
	// Will and WillProperties: the client's Last Will.
	Will           *paho.WillMessage
	WillProperties *paho.WillProperties
	// Session is paho's session state, kept across reconnects (default: in memory).
	Session session.SessionManager
	// Logger receives the connection's life (default slog.Default()).
	Logger *slog.Logger

	// Hooks, called after ConnState and the logs are updated, on autopaho's goroutines: they
	// must not block.
	OnUp           func(cm *autopaho.ConnectionManager, ack *paho.Connack)
	OnDown         func()
	OnConnectError func(err error)
	OnPublish      func(paho.PublishReceived)
	// Stopping reports that the owner is closing the connection: a connection lost then is
	// not reconnected, nor logged as a reconnect.
	Stopping func() bool
}

// Defaults of ClientSetup (and Config).
const (
	DefaultKeepAlive      = 30 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	// DefaultAgentSessionExpiry is the persistent session the example agents, make dev's agents
	// and the workload samples keep (Config.SessionExpiry): long enough to outlast a restart, a
	// broker failover or the refused CONNECTs of a rotation, so the broker keeps their requests
	// meanwhile; short enough that a removed agent's queue goes soon.
	DefaultAgentSessionExpiry = 5 * time.Minute
)

// ConnState is what a ClientSetup connection reports to health checks and logs.
type ConnState struct {
	log       *slog.Logger
	up        atomic.Bool
	everUp    atomic.Bool
	downSince atomic.Int64 // unix nanoseconds: since the last drop, or since the setup was built
	connects  atomic.Int64
	upSince   atomic.Int64 // unix nanoseconds: when the current (or last) connection came up
	// shortLived counts the connections in a row that were lost within shortLivedConnection of
	// coming up (takeoverBackoff).
	shortLived atomic.Int32
	lastErr    atomic.Pointer[error] // a Pointer, not a Value: see Conn.connErr
	lastWarned atomic.Pointer[string]
}

// Up reports whether a connection is established.
func (s *ConnState) Up() bool { return s.up.Load() }

// connection counts the connections established so far: a number that names the current one.
func (s *ConnState) connection() int64 { return s.connects.Load() }

// EverUp reports whether a connection was ever established.
func (s *ConnState) EverUp() bool { return s.everUp.Load() }

// LastConnectError is the error of the last failed connection attempt since the connection
// was last up (nil if none).
func (s *ConnState) LastConnectError() error {
	if p := s.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Healthy returns nil while the connection is up or has been down for less than grace (an
// expected reconnect), and otherwise an error saying how long it has been down (or not
// connected yet) and the last connect error.
func (s *ConnState) Healthy(grace time.Duration) error {
	if s.up.Load() {
		return nil
	}
	down := time.Since(time.Unix(0, s.downSince.Load()))
	if down < grace {
		return nil
	}
	what := fmt.Sprintf("connection down for %s", down.Round(time.Second))
	if !s.everUp.Load() {
		what = fmt.Sprintf("not connected after %s", down.Round(time.Second))
	}
	if err := s.LastConnectError(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return errors.New(what)
}

// ReconnectBackoff is the reconnect delay of every a2a-fleet connection: autopaho waits
// backoff(0) before every connection sequence, the very first included, so attempt 0 is
// immediate; then 250 ms doubling up to 5 s, so a restarted broker is picked up quickly.
func ReconnectBackoff(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	return min(time.Duration(250*(1<<min(attempt-1, 5)))*time.Millisecond, 5*time.Second)
}

// Config returns the autopaho configuration and the state it keeps up to date.
func (s ClientSetup) Config() (autopaho.ClientConfig, *ConnState) {
	if s.KeepAlive <= 0 {
		s.KeepAlive = DefaultKeepAlive
	}
	if s.ConnectTimeout <= 0 {
		s.ConnectTimeout = DefaultConnectTimeout
	}
	if s.Session == nil {
		s.Session = state.NewInMemory()
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	st := &ConnState{log: log}
	st.downSince.Store(time.Now().UnixNano())
	stopping := func() bool { return s.Stopping != nil && s.Stopping() }
	password := s.Password
	persistent := s.SessionExpiry > 0
	cfg := autopaho.ClientConfig{
		ServerUrls:     []*url.URL{s.URL},
		TlsCfg:         s.TLS,
		KeepAlive:      uint16(min(s.KeepAlive/time.Second, math.MaxUint16)),
		ConnectTimeout: s.ConnectTimeout,
		ReconnectBackoff: func(attempt int) time.Duration {
			d := ReconnectBackoff(attempt)
			if attempt == 0 {
				// autopaho asks for attempt 0 before each connection sequence: after a drop,
				// this is where a connection that lived only moments waits.
				d = takeoverBackoff(int(st.shortLived.Load()))
			}
			if s.RefusedRetry > 0 && d > s.RefusedRetry && st.refused() {
				return s.RefusedRetry
			}
			return d
		},
		// Plain TCP: reads through a buffer (dial.go); TLS and WebSocket: autopaho's dialers.
		AttemptConnection: bufferedDial(s.URL, s.ConnectTimeout),
		ConnectUsername:   s.Username,
		WillMessage:       s.Will,
		WillProperties:    s.WillProperties,
		// A clean session on every connect, not only the first: a broker that still holds the
		// previous connection's session (mochi does, briefly, after a kick) would otherwise
		// resume it, with subscriptions granted under the old rights.
		CleanStartOnInitialConnection: !persistent,
		ConnectPacketBuilder: func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			if !persistent {
				cp.CleanStart = true
			}
			if creds := s.Credentials; creds != nil {
				user, pw, err := creds.Credentials()
				if err != nil {
					return nil, err
				}
				cp.UsernameFlag, cp.Username = user != "", user
				cp.PasswordFlag, cp.Password = len(pw) > 0, pw
			} else if password != nil {
				if pw := password(); len(pw) > 0 {
					cp.PasswordFlag, cp.Password = true, pw
				}
			}
			if cp.Properties != nil {
				// paho encodes an unset bool as Request Problem Information 0 once any CONNECT
				// property is set (the session expiry), and mochi then strips the user
				// properties (a2a-context-id, traceparent) from every PUBLISH it delivers.
				cp.Properties.RequestProblemInfo = true
			}
			return cp, nil
		},
		OnConnectionUp: func(cm *autopaho.ConnectionManager, ack *paho.Connack) {
			st.markUp()
			if s.OnUp != nil {
				s.OnUp(cm, ack)
			}
		},
		OnConnectionDown: func() bool {
			st.markDown(s.ClientID)
			reconnect := !stopping()
			if reconnect {
				// Expected in the life of any long-running client (broker restart, network
				// blip): autopaho reconnects. Readiness turns false only after a grace period.
				log.Info("mqtt connection lost; reconnecting")
			}
			if s.OnDown != nil {
				s.OnDown()
			}
			return reconnect
		},
		OnConnectError: func(err error) {
			st.lastErr.Store(&err)
			st.logConnectError(err)
			if s.OnConnectError != nil {
				s.OnConnectError(err)
			}
		},
		ClientConfig: paho.ClientConfig{
			ClientID:      s.ClientID,
			Session:       s.Session,
			PacketTimeout: s.PacketTimeout,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(pr paho.PublishReceived) (bool, error) {
					if s.OnPublish != nil {
						s.OnPublish(pr)
					}
					return true, nil
				},
			},
			OnClientError:      func(err error) { log.Debug("mqtt client error", "err", err) },
			OnServerDisconnect: func(d *paho.Disconnect) { logServerDisconnect(log, d) },
		},
	}
	if persistent {
		cfg.SessionExpiryInterval = uint32(max(min(s.SessionExpiry/time.Second, math.MaxUint32), 1))
	}
	return cfg, st
}

// refused reports whether the last connection attempt was refused by the broker (a CONNACK with
// a failure reason code).
func (s *ConnState) refused() bool {
	var refused *autopaho.ConnackError
	err := s.LastConnectError()
	return err != nil && errors.As(err, &refused)
}

// markUp records a new connection (on autopaho's goroutine; must not block).
func (s *ConnState) markUp() {
	n := s.connects.Add(1)
	s.upSince.Store(time.Now().UnixNano())
	s.up.Store(true)
	s.lastErr.Store(nil)
	s.lastWarned.Store(nil)
	if n > 1 {
		down := time.Since(time.Unix(0, s.downSince.Load())).Round(time.Millisecond)
		s.log.Info("mqtt connection restored", "down_for", down.String())
	}
	s.everUp.Store(true)
}

// shortLivedConnection: a connection lost sooner than this after it came up counts towards
// takeoverBackoff.
const shortLivedConnection = 2 * time.Second

// markDown records a lost connection; it returns how many connections in a row were lost within
// shortLivedConnection of coming up (0 when this one lived longer).
func (s *ConnState) markDown(clientID string) int {
	s.up.Store(false)
	now := time.Now()
	s.downSince.Store(now.UnixNano())
	if now.Sub(time.Unix(0, s.upSince.Load())) >= shortLivedConnection {
		s.shortLived.Store(0)
		return 0
	}
	n := int(s.shortLived.Add(1))
	if n == 3 {
		// Once per run of short connections: the usual cause is a second client with the same
		// client ID (two processes of one Agent), each taking the session from the other.
		s.log.Warn("mqtt connection lost right after connecting, several times in a row: is another client using this client ID? Reconnecting more slowly",
			"client_id", clientID, "lost_within", shortLivedConnection.String())
	}
	return n
}

// takeoverBackoff is the delay before the connection sequence that follows a run of n short-lived
// connections: 0 for none or one (a kick right after connecting is reconnected at once), then
// 250 ms doubling up to 5 s, with up to a quarter more at random so that two such clients drift
// apart.
// Two clients with one client ID (MQTT lets the newer connection take the session over) would
// otherwise take it from each other as fast as they can connect (hundreds of CONNECTs a second,
// each one kicking the other), loading the broker and every client's reconnect logs; with it
// they settle to one takeover every few seconds, and a restarted broker, or a kick of a
// connection that had been up, is still reconnected at once.
func takeoverBackoff(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	d := ReconnectBackoff(n - 1)
	return d + rand.N(d/4+1)
}

// connectWarnAfter is how long a dial error stays a DEBUG-level, expected reconnect.
const connectWarnAfter = 30 * time.Second

// logConnectError reports a failed connection attempt. A dial error while the broker restarts
// is expected and stays at DEBUG until the connection has been down longer than a short grace;
// a broker that refuses the CONNECT (wrong or rotated credentials, not authorised) is a
// problem someone must fix, reported at WARN once per distinct cause.
func (s *ConnState) logConnectError(err error) {
	var refused *autopaho.ConnackError
	msg := err.Error()
	if prev := s.lastWarned.Load(); prev != nil && *prev == msg {
		s.log.Debug("mqtt connect attempt failed", "err", err)
		return
	}
	downFor := time.Since(time.Unix(0, s.downSince.Load()))
	switch {
	case errors.As(err, &refused):
		s.lastWarned.Store(&msg)
		s.log.Warn("broker refused the connection; retrying", "reason_code", fmt.Sprintf("0x%02x", refused.ReasonCode), "reason", refused.Reason, "err", err)
	case s.everUp.Load() && downFor > connectWarnAfter:
		s.lastWarned.Store(&msg)
		s.log.Warn("broker still unreachable; retrying", "down_for", downFor.Round(time.Second).String(), "err", err)
	default:
		s.log.Debug("mqtt connect attempt failed", "err", err)
	}
}

// logServerDisconnect reports a DISCONNECT sent by the broker. A broker shutting down (0x8B) or
// an administrative kick (0x98: dynsec changed this client's rights) is an expected reconnect;
// a session taken over (0x8E: another client uses this Client ID) is worth a WARN.
func logServerDisconnect(log *slog.Logger, d *paho.Disconnect) {
	if d == nil {
		return
	}
	reason := ""
	if d.Properties != nil {
		reason = d.Properties.ReasonString
	}
	code := fmt.Sprintf("0x%02x", d.ReasonCode)
	switch d.ReasonCode {
	case 0x8B: // Server shutting down
		log.Info("broker is shutting down; reconnecting", "reason_code", code, "reason", reason)
	case 0x98: // Administrative action: dynsec disconnects a client whose rights changed
		log.Info("broker disconnected this client after an administrative change (e.g. its rights); reconnecting", "reason_code", code, "reason", reason)
	case 0x8E: // Session taken over
		log.Warn("broker disconnected this client: another client connected with the same Client ID", "reason_code", code, "reason", reason)
	default:
		log.Warn("broker sent DISCONNECT; reconnecting", "reason_code", code, "reason", reason)
	}
}
