package registration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// MQTTCardPublisher publishes agent cards over its own autopaho connection.
type MQTTCardPublisher struct {
	cm *autopaho.ConnectionManager
}

// NewMQTTCardPublisher gives the operator's card-publishing identity a fresh password on the
// broker (through backend) and connects with it. Nothing is stored: every start rotates it.
func NewMQTTCardPublisher(ctx context.Context, backend acl.Backend, brokerURL string, tlsCfg *tls.Config) (*MQTTCardPublisher, error) {
	password, err := identity.NewPassword()
	if err != nil {
		return nil, fmt.Errorf("operator credentials: %w", err)
	}
	role := acl.Role{Name: identity.OperatorUsername, ACLs: []acl.ACL{
		{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodDiscovery), Allow: true},
	}}
	client := acl.Client{Username: identity.OperatorUsername, Roles: []acl.RoleRef{{Name: role.Name}}}
	desired := acl.Desired{
		State:     acl.NewState([]acl.Role{role}, nil, []acl.Client{client}),
		Passwords: map[string]string{identity.OperatorUsername: password},
	}
	res, err := acl.Apply(ctx, backend, desired)
	if err != nil {
		return nil, fmt.Errorf("ensure operator identity: %w", err)
	}
	if !createdClient(res, identity.OperatorUsername) {
		if err := acl.SetPassword(ctx, backend, identity.OperatorUsername, password); err != nil {
			return nil, fmt.Errorf("set operator password: %w", err)
		}
	}

	u, err := a2amqtt.ParseBrokerURL(brokerURL)
	if err != nil {
		return nil, err
	}
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		TlsCfg:                        tlsCfg,
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		SessionExpiryInterval:         0,
		ConnectUsername:               identity.OperatorUsername,
		ConnectPassword:               []byte(password),
		ConnectTimeout:                10 * time.Second,
		ClientConfig:                  paho.ClientConfig{ClientID: "a2a-fleet-operator-" + password[:8]},
	})
	if err != nil {
		return nil, fmt.Errorf("connect card publisher: %w", err)
	}
	if err := cm.AwaitConnection(ctx); err != nil {
		return nil, fmt.Errorf("connect card publisher to %s: %w", brokerURL, err)
	}
	return &MQTTCardPublisher{cm: cm}, nil
}

// PublishCard publishes a retained card (QoS 1); an empty payload clears the retained message.
func (p *MQTTCardPublisher) PublishCard(ctx context.Context, topic string, payload []byte, props map[string]string) error {
	pub := &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: payload, Properties: &paho.PublishProperties{}}
	if len(payload) > 0 {
		pub.Properties.ContentType = "application/json"
	}
	for k, v := range props {
		pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: k, Value: v})
	}
	resp, err := p.cm.Publish(ctx, pub)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	if resp != nil && resp.ReasonCode >= 0x80 {
		return fmt.Errorf("publish %s: broker refused with reason code %d", topic, resp.ReasonCode)
	}
	return nil
}

// Close disconnects.
func (p *MQTTCardPublisher) Close(ctx context.Context) error { return p.cm.Disconnect(ctx) }
