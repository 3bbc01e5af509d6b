/* A stand-in for libnvidia-ml on machines without an NVIDIA driver: the few NVML calls the bringup_facts
 * module makes (persistence mode per GPU), answered from a text file, so the nvidia_driver role's
 * verification runs on CPU test hosts. Build:
 *   cc -shared -fPIC -DSTATE_FILE='"/srv/fake-nvml/gpus"' -o libnvidia-ml.so.1 fake_nvml.c
 * The file holds a line per GPU, "<NVML bus id> <persistence 0|1>"; a missing file is a driver not loaded.
 */
#include <stdio.h>
#include <string.h>

#define MAX_GPUS 16
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_info;
static char bus_ids[MAX_GPUS][32];
static int persistence[MAX_GPUS];
static unsigned count;

const char *nvmlErrorString(int rc) { return rc == 9 ? "Driver Not Loaded" : rc == 2 ? "Invalid Argument" : "Unknown Error"; }

int nvmlInit_v2(void) {
    FILE *f = fopen(STATE_FILE, "r");
    if (!f) return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
    count = 0;
    while (count < MAX_GPUS && fscanf(f, "%31s %d", bus_ids[count], &persistence[count]) == 2) count++;
    fclose(f);
    return 0;
}
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = count; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **handle) {
    if (i >= count) return 2;
    *handle = &persistence[i];
    return 0;
}
int nvmlDeviceGetPersistenceMode(void *handle, int *mode) { *mode = *(int *)handle; return 0; }
int nvmlDeviceGetPciInfo_v3(void *handle, pci_info *pci) {
    memset(pci, 0, sizeof *pci);
    strncpy(pci->busId, bus_ids[(int *)handle - persistence], sizeof pci->busId - 1);
    return 0;
}
