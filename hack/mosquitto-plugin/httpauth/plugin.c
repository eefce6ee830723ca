//go:build mosquittoplugin

/*
 * The C half of the a2a-fleet HTTP-auth plugin for Mosquitto 2.0 (plugin API v5): it registers
 * CONNECT authentication and the ACL check and forwards each to the Go half (main.go), which
 * asks the decision service over HTTP in mosquitto-go-auth's HTTP backend protocol, with
 * go-auth's answer cache (internal/mqtt/decision's Caller). Like go-auth, every uncached
 * answer is one blocking HTTP round trip on Mosquitto's thread.
 */
#include <stdint.h>
#include <stdlib.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#include "_cgo_export.h"

static mosquitto_plugin_id_t *plugin_id;

void a2a_httpauth_log(int level, const char *msg)
{
	mosquitto_log_printf(level, "%s", msg);
}

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_basic_auth *ed = event_data;
	(void)event;
	return a2aHTTPAuthBasicAuth((uintptr_t)userdata, ed->username, ed->password, (char *)mosquitto_client_id(ed->client));
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	(void)event;
	return a2aHTTPAuthACLCheck((uintptr_t)userdata, (char *)mosquitto_client_username(ed->client),
		(char *)mosquitto_client_id(ed->client), ed->access, (char *)ed->topic);
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
	handle = a2aHTTPAuthInit(keys, values, opt_count);
	free(keys);
	free(values);
	if(handle == 0){
		return MOSQ_ERR_INVAL;
	}
	ud = (void *)handle;
	*user_data = ud;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, ud)) != MOSQ_ERR_SUCCESS) return rc;
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, ud)) != MOSQ_ERR_SUCCESS) return rc;
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *user_data, struct mosquitto_opt *opts, int opt_count)
{
	(void)opts; (void)opt_count;
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
	a2aHTTPAuthCleanup((uintptr_t)user_data);
	return MOSQ_ERR_SUCCESS;
}
