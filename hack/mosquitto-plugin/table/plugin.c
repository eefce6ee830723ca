//go:build mosquittoplugin

/*
 * The C half of the a2a-fleet decision-table plugin for Mosquitto 2.0 (plugin API v5): it
 * registers the broker's events and forwards each to the Go half (main.go), which answers
 * from internal/mqtt/mosqtable's Plugin: the operator's acl.Policy in the broker's memory.
 * Everything runs on Mosquitto's single thread; the Go half's only other thread is its disk
 * writer, which never calls into the broker.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#include "_cgo_export.h"

#define CONTROL_TOPIC "$CONTROL/a2a-fleet/v1"
#define RESPONSE_TOPIC "$CONTROL/a2a-fleet/v1/response"

static mosquitto_plugin_id_t *plugin_id;

void a2a_table_kick(const char *username)
{
	mosquitto_kick_client_by_username(username, false);
}

void a2a_table_publish(const char *topic, const void *payload, int len)
{
	/* QoS 1, as the control responses: the admin gets the events and the answers in the
	 * broker's order. */
	mosquitto_broker_publish_copy(NULL, topic, len, payload, 1, false, NULL);
}

void a2a_table_log(int level, const char *msg)
{
	mosquitto_log_printf(level, "%s", msg);
}

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_basic_auth *ed = event_data;
	(void)event;
	/* The client's pointer names the connection: the disconnect event carries the same one. */
	return a2aTableBasicAuth((uintptr_t)userdata, (uintptr_t)ed->client, ed->username, ed->password, (char *)mosquitto_client_id(ed->client));
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	(void)event;
	return a2aTableACLCheck((uintptr_t)userdata, (char *)mosquitto_client_username(ed->client), ed->access, (char *)ed->topic);
}

static int on_control(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_control *ed = event_data;
	int len = 0;
	void *resp;
	(void)event;
	resp = a2aTableControl((uintptr_t)userdata, (char *)mosquitto_client_username(ed->client), (void *)ed->payload, (int)ed->payloadlen, &len);
	if(resp == NULL){
		return MOSQ_ERR_NOMEM;
	}
	mosquitto_broker_publish_copy(NULL, RESPONSE_TOPIC, len, resp, 1, false, NULL);
	free(resp);
	return MOSQ_ERR_SUCCESS;
}

static int on_disconnect(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_disconnect *ed = event_data;
	(void)event;
	a2aTableDisconnect((uintptr_t)userdata, (uintptr_t)ed->client, ed->reason);
	return MOSQ_ERR_SUCCESS;
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

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **user_data, struct mosquitto_opt *opts, int opt_count)
{
	char **keys, **values;
	uintptr_t handle;
	void *ud;
	int rc;

	plugin_id = identifier;
	keys = calloc((size_t)opt_count + 1, sizeof(char *));
	values = calloc((size_t)opt_count + 1, sizeof(char *));
	if(keys == NULL || values == NULL){
		free(keys);
		free(values);
		return MOSQ_ERR_NOMEM;
	}
	for(int i = 0; i < opt_count; i++){
		keys[i] = opts[i].key;
		values[i] = opts[i].value;
	}
	handle = a2aTableInit(keys, values, opt_count);
	free(keys);
	free(values);
	if(handle == 0){
		return MOSQ_ERR_INVAL;
	}
	/* The Go half's state travels as the callbacks' userdata (a cgo.Handle): no globals. */
	ud = (void *)handle;
	*user_data = ud;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, ud)) != MOSQ_ERR_SUCCESS) return rc;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, ud)) != MOSQ_ERR_SUCCESS) return rc;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC, ud)) != MOSQ_ERR_SUCCESS) return rc;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, ud)) != MOSQ_ERR_SUCCESS) return rc;
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *user_data, struct mosquitto_opt *opts, int opt_count)
{
	(void)opts; (void)opt_count;
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_CONTROL, on_control, CONTROL_TOPIC);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
	a2aTableCleanup((uintptr_t)user_data);
	return MOSQ_ERR_SUCCESS;
}
