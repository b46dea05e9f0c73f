-- Why a device rejected its configuration, in its own words (issue 37 item 3): the end of what the
-- failing health check printed and the workload log's last lines, as the device sent them with the
-- rejection (each at most 2,048 characters: device_client/logtail.py, the wire schema holds the
-- device to it). Set with config_status 'rejected', cleared with every other status.
ALTER TABLE devices ADD COLUMN config_check_output text;
ALTER TABLE devices ADD COLUMN config_workload_log text;
