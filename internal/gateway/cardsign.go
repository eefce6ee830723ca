package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// cardKeysReload is how often a CardSigner reads its folder again: a mounted Secret's files
// change in place at a rotation, and the overlap window (docs/security.md) is far longer.
const cardKeysReload = 30 * time.Second

// CardSigner signs the cards the gateway serves over HTTP with keys of the gateway's own, read
// from a folder (a mounted Secret): every file named tls.key or *.pem is a PEM private key (ECDSA
// P-256 or Ed25519), and every key signs, so a rotation is the operator's: add the new key, wait
// the overlap window, remove the old one. The keys are not the operator's: an HTTP card is not
// the bus's card (its interface is the gateway's URL, its security scheme the gateway's), so the
// bus's signature cannot cover it, and the bus's keys stay with the operator alone
// (docs/security.md, "Cards the gateway serves").
type CardSigner struct {
	dir string

	mu     sync.Mutex
	keys   []*cardsig.Key
	loaded time.Time
}

// NewCardSigner reads the keys in dir; it fails when there is none.
func NewCardSigner(dir string) (*CardSigner, error) {
	s := &CardSigner{dir: dir}
	keys, err := readCardKeys(dir)
	if err != nil {
		return nil, err
	}
	s.keys, s.loaded = keys, time.Now()
	return s, nil
}

// Keys returns the signing keys, read again from the folder when the last read is older than
// cardKeysReload (a failed read keeps the keys it has).
func (s *CardSigner) Keys() []*cardsig.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.loaded) > cardKeysReload {
		if keys, err := readCardKeys(s.dir); err == nil {
			s.keys = keys
		}
		s.loaded = time.Now()
	}
	return s.keys
}

// PublicKeys is the JWK Set of the signing keys.
func (s *CardSigner) PublicKeys() jose.JSONWebKeySet { return cardsig.KeySet(s.Keys()...) }

// readCardKeys parses every key file of dir, in the order of their names.
func readCardKeys(dir string) ([]*cardsig.Key, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("card signing keys: %w", err)
	}
	var keys []*cardsig.Key
	for _, e := range entries {
		name := e.Name()
		// A mounted Secret's files are symlinks into a ..data folder: follow them, skip the
		// dot-entries.
		if strings.HasPrefix(name, ".") || (name != registration.CardKeyTLSKey && !strings.HasSuffix(name, registration.CardKeySuffix)) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("card signing key %s: %w", name, err)
		}
		k, err := cardsig.ParseKeyPEM(data)
		if err != nil {
			return nil, fmt.Errorf("card signing key %s: %w", name, err)
		}
		if !slices.ContainsFunc(keys, func(o *cardsig.Key) bool { return o.ID == k.ID }) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("card signing keys: no key in %s (a file named %s or *%s)", dir, registration.CardKeyTLSKey, registration.CardKeySuffix)
	}
	return keys, nil
}
