# Runs an MPI program that must end its job: passes when mpirun exits non-zero within
# MAX_SECONDS and the output matches EXPECT. Variables: MPIEXEC, NP, PROGRAM, ARGS, EXPECT,
# MAX_SECONDS. Usage: cmake -DMPIEXEC=... -P expect_abort.cmake
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --bind-to none -np ${NP} -x OMP_NUM_THREADS=1 ${PROGRAM}
          ${ARGS}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("--- output of ${PROGRAM} ${ARGS} (exit ${rc}, ${elapsed} s):\n${out}${err}---")
if("${rc}" STREQUAL "0")
  message(FATAL_ERROR "the job exited 0; it should have been aborted")
endif()
if(NOT "${rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end within ${MAX_SECONDS} s: ${rc}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match: ${EXPECT}")
endif()
