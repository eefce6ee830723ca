/*
 * a2a-fleet sender stamp: a Mosquitto 2.0 plugin (plugin API v5) that tells subscribers who
 * published a message, as the embedded broker does (internal/mqtt/embedded, OnPublish).
 *
 *  - MOSQ_EVT_MESSAGE: every PUBLISH a client sends gets the user property
 *    "a2a-fleet-sender" = the publisher's authenticated broker username; any copy the client put
 *    there itself is removed first (the order of the other user properties is kept). A client
 *    without a username gets no stamp, only the removal.
 *
 *  - A Will never passes MOSQ_EVT_MESSAGE in Mosquitto 2.0 (context__send_will queues it
 *    directly), so it cannot be stamped, and it could carry a forged copy. Its delivery is
 *    refused on the topics where the stamp is trusted (by default $a2a/v1/request/#, the request
 *    topics the conversation service reads): a Will is recognised as the messages's write check
 *    (MOSQ_EVT_ACL_CHECK, MOSQ_ACL_WRITE) followed by read checks for its subscribers with no
 *    MOSQ_EVT_MESSAGE in between; a PUBLISH always has its MOSQ_EVT_MESSAGE between the two.
 *    The broker is single-threaded, and the will's write and read checks run in one call
 *    (context__send_will -> db__messages_easy_queue -> subs__send); every other event resets
 *    the recognition.
 *
 *  - Two of the broker's own log lines are not delivered on $SYS/broker/log/#: "Outgoing
 *    messages are being dropped for client ..." and "Dropping too large outgoing PUBLISH ...".
 *    Mosquitto (2.0.11 to 2.0.20) publishes a log line synchronously, from inside the call that
 *    logs it, and it logs these two while it walks one client's outgoing messages
 *    (db__message_write_inflight_out_latest -> send__publish -> packet__queue, when the client's
 *    socket queue holds max_queued_messages packets). Delivered to a subscriber of the log topic,
 *    the line starts a second walk of that subscriber's messages inside the first; when the
 *    subscriber is the client being walked (the operator reads $SYS/broker/log/N and receives
 *    every retained card on one connection), the outer walk then continues on messages the inner
 *    one sent and freed, and the broker dies with SIGSEGV (db__message_remove,
 *    db__msg_store_remove). Refusing the two lines to every reader keeps the log topic out of the
 *    walk; they still reach the broker's other log destinations (stdout).
 *
 * Load it BEFORE the dynamic-security plugin, so its ACL callback sees every check first (but
 * for the two refusals above it defers every decision to dynsec):
 *
 *   plugin /usr/lib/mosquitto_a2a_fleet_sender.so
 *   plugin /usr/lib/mosquitto_dynamic_security.so
 *   plugin_opt_config_file /mosquitto/data/dynamic-security.json
 *
 * Options (plugin_opt_..., after the plugin line):
 *   sender_property   the user property name (default a2a-fleet-sender)
 *   unstamped_deny    a topic filter on which Wills are not delivered (default $a2a/v1/request/#;
 *                     repeat the option for several; "none" delivers Wills everywhere)
 *
 * Built against Debian's mosquitto-dev and libmosquitto-dev by hack/build-mosquitto-plugin.sh.
 * Its symbols (mosquitto_property_*, mosquitto_callback_register, ...) are resolved from the
 * broker binary when it loads the plugin; it links against nothing but libc.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#define DEFAULT_SENDER_PROPERTY "a2a-fleet-sender"
#define DEFAULT_UNSTAMPED_DENY "$a2a/v1/request/#"
#define MAX_FILTERS 16

static mosquitto_plugin_id_t *plugin_id;
static char *sender_property;
static char *deny_filters[MAX_FILTERS];
static int deny_filter_count;

/* The last write check, until the message it checked was stamped or another event came. */
static struct {
	const struct mosquitto *client;
	char *topic;
	bool pending; /* a write check not followed by MOSQ_EVT_MESSAGE */
	bool logged;
} last_write;

static void forget_write(void)
{
	mosquitto_free(last_write.topic);
	last_write.topic = NULL;
	last_write.client = NULL;
	last_write.pending = false;
	last_write.logged = false;
}

static bool denied_unstamped(const char *topic)
{
	for(int i = 0; i < deny_filter_count; i++){
		bool match = false;
		if(mosquitto_topic_matches_sub(deny_filters[i], topic, &match) == MOSQ_ERR_SUCCESS && match){
			return true;
		}
	}
	return false;
}

/* Log lines Mosquitto logs while it writes a client's outgoing messages (see the top comment):
 * never delivered on the log topic. */
static const char *const walk_log_lines[] = {
	"Outgoing messages are being dropped for client ",
	"Dropping too large outgoing PUBLISH",
};

static bool is_walk_log_line(const char *topic, const void *payload, uint32_t payloadlen)
{
	if(strncmp(topic, "$SYS/broker/log/", strlen("$SYS/broker/log/")) != 0 || payload == NULL){
		return false;
	}
	for(size_t i = 0; i < sizeof(walk_log_lines)/sizeof(walk_log_lines[0]); i++){
		if(memmem(payload, payloadlen, walk_log_lines[i], strlen(walk_log_lines[i])) != NULL){
			return true;
		}
	}
	return false;
}

static bool is_sender_property(const mosquitto_property *p)
{
	char *name = NULL, *value = NULL;
	bool found;

	if(mosquitto_property_identifier(p) != MQTT_PROP_USER_PROPERTY){
		return false;
	}
	if(!mosquitto_property_read_string_pair(p, MQTT_PROP_USER_PROPERTY, &name, &value, false)){
		return false;
	}
	found = name != NULL && strcmp(name, sender_property) == 0;
	mosquitto_free(name);
	mosquitto_free(value);
	return found;
}

/* copy_property appends a copy of p to *out. A stored PUBLISH keeps only these five kinds of
 * property (handle__publish drops the rest), so that is all it needs to copy. */
static int copy_property(mosquitto_property **out, const mosquitto_property *p)
{
	int id = mosquitto_property_identifier(p);
	int rc = MOSQ_ERR_SUCCESS;
	char *s = NULL, *name = NULL;
	void *bin = NULL;
	uint16_t len = 0;
	uint8_t byte = 0;

	switch(id){
		case MQTT_PROP_USER_PROPERTY:
			if(!mosquitto_property_read_string_pair(p, id, &name, &s, false)) return MOSQ_ERR_INVAL;
			rc = mosquitto_property_add_string_pair(out, id, name, s);
			break;
		case MQTT_PROP_CONTENT_TYPE:
		case MQTT_PROP_RESPONSE_TOPIC:
			if(!mosquitto_property_read_string(p, id, &s, false)) return MOSQ_ERR_INVAL;
			rc = mosquitto_property_add_string(out, id, s);
			break;
		case MQTT_PROP_CORRELATION_DATA:
			if(!mosquitto_property_read_binary(p, id, &bin, &len, false)) return MOSQ_ERR_INVAL;
			rc = mosquitto_property_add_binary(out, id, bin, len);
			break;
		case MQTT_PROP_PAYLOAD_FORMAT_INDICATOR:
			if(!mosquitto_property_read_byte(p, id, &byte, false)) return MOSQ_ERR_INVAL;
			rc = mosquitto_property_add_byte(out, id, byte);
			break;
		default:
			mosquitto_log_printf(MOSQ_LOG_WARNING, "a2a-fleet-sender: unexpected property %d in a PUBLISH; refusing it", id);
			return MOSQ_ERR_INVAL;
	}
	mosquitto_free(name);
	mosquitto_free(s);
	mosquitto_free(bin);
	return rc;
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	const char *username = mosquitto_client_username(ed->client);
	const mosquitto_property *p;
	bool forged = false;
	int rc;

	(void)event;
	(void)userdata;
	if(last_write.pending && last_write.client == ed->client && last_write.topic && strcmp(last_write.topic, ed->topic) == 0){
		last_write.pending = false;
	}
	for(p = ed->properties; p; p = mosquitto_property_next(p)){
		if(is_sender_property(p)){
			forged = true;
			break;
		}
	}
	if(forged){
		mosquitto_property *kept = NULL;
		for(p = ed->properties; p; p = mosquitto_property_next(p)){
			if(is_sender_property(p)){
				continue;
			}
			if((rc = copy_property(&kept, p)) != MOSQ_ERR_SUCCESS){
				mosquitto_property_free_all(&kept);
				/* Never pass on a message whose copy is not the broker's: refuse it. */
				return MOSQ_ERR_ACL_DENIED;
			}
		}
		mosquitto_property_free_all(&ed->properties);
		ed->properties = kept;
	}
	if(username){
		rc = mosquitto_property_add_string_pair(&ed->properties, MQTT_PROP_USER_PROPERTY, sender_property, username);
		if(rc != MOSQ_ERR_SUCCESS){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "a2a-fleet-sender: cannot stamp a message of %s (%d); refusing it", username, rc);
			return MOSQ_ERR_ACL_DENIED;
		}
	}
	return MOSQ_ERR_SUCCESS;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;

	(void)event;
	(void)userdata;
	switch(ed->access){
		case MOSQ_ACL_WRITE:
			forget_write();
			last_write.client = ed->client;
			last_write.topic = mosquitto_strdup(ed->topic);
			last_write.pending = last_write.topic != NULL;
			break;
		case MOSQ_ACL_READ:
			if(is_walk_log_line(ed->topic, ed->payload, ed->payloadlen)){
				return MOSQ_ERR_ACL_DENIED;
			}
			if(last_write.pending && strcmp(last_write.topic, ed->topic) == 0 && denied_unstamped(ed->topic)){
				if(!last_write.logged){
					const char *id = mosquitto_client_id(last_write.client);
					mosquitto_log_printf(MOSQ_LOG_NOTICE,
							"a2a-fleet-sender: not delivering the Will of %s on %s: a Will cannot carry the sender stamp",
							id ? id : "?", ed->topic);
					last_write.logged = true;
				}
				return MOSQ_ERR_ACL_DENIED;
			}
			break;
		default:
			forget_write();
	}
	return MOSQ_ERR_PLUGIN_DEFER;
}

static int on_reset(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)event_data;
	(void)userdata;
	forget_write();
	return MOSQ_ERR_PLUGIN_DEFER;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for(int i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5){
			return 5;
		}
	}
	return -1;
}

static void free_options(void)
{
	mosquitto_free(sender_property);
	sender_property = NULL;
	for(int i = 0; i < deny_filter_count; i++){
		mosquitto_free(deny_filters[i]);
	}
	deny_filter_count = 0;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *opts, int opt_count)
{
	bool deny_set = false;
	int rc;

	(void)userdata;
	plugin_id = identifier;
	for(int i = 0; i < opt_count; i++){
		if(strcmp(opts[i].key, "sender_property") == 0){
			mosquitto_free(sender_property);
			sender_property = mosquitto_strdup(opts[i].value);
		}else if(strcmp(opts[i].key, "unstamped_deny") == 0){
			deny_set = true;
			if(strcmp(opts[i].value, "none") == 0){
				continue;
			}
			if(deny_filter_count == MAX_FILTERS || mosquitto_sub_topic_check(opts[i].value) != MOSQ_ERR_SUCCESS){
				mosquitto_log_printf(MOSQ_LOG_ERR, "a2a-fleet-sender: unstamped_deny %s: not a topic filter, or more than %d", opts[i].value, MAX_FILTERS);
				free_options();
				return MOSQ_ERR_INVAL;
			}
			deny_filters[deny_filter_count++] = mosquitto_strdup(opts[i].value);
		}
	}
	if(!sender_property){
		sender_property = mosquitto_strdup(DEFAULT_SENDER_PROPERTY);
	}
	if(!deny_set){
		deny_filters[deny_filter_count++] = mosquitto_strdup(DEFAULT_UNSTAMPED_DENY);
	}
	if(!sender_property || (deny_filter_count > 0 && !deny_filters[deny_filter_count-1])){
		free_options();
		return MOSQ_ERR_NOMEM;
	}
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL)) != MOSQ_ERR_SUCCESS
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL)) != MOSQ_ERR_SUCCESS
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_BASIC_AUTH, on_reset, NULL, NULL)) != MOSQ_ERR_SUCCESS
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_DISCONNECT, on_reset, NULL, NULL)) != MOSQ_ERR_SUCCESS
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_TICK, on_reset, NULL, NULL)) != MOSQ_ERR_SUCCESS){
		free_options();
		return rc;
	}
	mosquitto_log_printf(MOSQ_LOG_INFO, "a2a-fleet-sender: stamping every PUBLISH with user property %s; Wills not delivered on %d filter(s)",
			sender_property, deny_filter_count);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *opts, int opt_count)
{
	(void)userdata;
	(void)opts;
	(void)opt_count;
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_BASIC_AUTH, on_reset, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_DISCONNECT, on_reset, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_TICK, on_reset, NULL);
	forget_write();
	free_options();
	return MOSQ_ERR_SUCCESS;
}
